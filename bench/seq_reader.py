#!/usr/bin/env python3
"""One-request-at-a-time remote reader: the baseline of seed 000's eq. 1.

A tiny block server and a client over a plain TCP socket. The client asks for
`--bs` bytes (64 KiB by default) at the next offset, waits for the whole answer,
then asks for the next block: exactly one request in flight, no read-ahead, so every
block costs one round trip plus its transfer time, T <= B / (1 + R*B/D).

  seq_reader.py serve --listen 10.99.0.1:7200 --root DIR
  seq_reader.py read --connect 10.99.0.1:7200 --path FILE [--bs 65536] [--max-seconds 15]

`read` prints one line: "<bytes> <seconds> <complete 0|1>". It stops at end of file
or after --max-seconds (then complete=0), so a run is bounded at any RTT.
Protocol: client sends the path once ("<len u32><utf-8 path>"), then requests
"<offset u64><length u32>"; the server answers each with "<length u32><bytes>"
(a short or empty answer means end of file).
"""
import argparse
import os
import socket
import socketserver
import struct
import sys
import time


def recv_exact(sock, n, buf=None):
    view = memoryview(buf)[:n] if buf is not None else memoryview(bytearray(n))
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("connection closed")
        got += k
    return view


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            (plen,) = struct.unpack("<I", recv_exact(sock, 4))
            path = bytes(recv_exact(sock, plen)).decode()
            root = os.path.realpath(self.server.root)
            full = os.path.realpath(path if os.path.isabs(path) else os.path.join(root, path))
            if not full.startswith(root + os.sep):
                return
            fd = os.open(full, os.O_RDONLY)
        except (EOFError, OSError, UnicodeDecodeError):
            return
        try:
            while True:
                try:
                    off, length = struct.unpack("<QI", recv_exact(sock, 12))
                except EOFError:
                    return
                data = os.pread(fd, min(length, 64 << 20), off)
                sock.sendall(struct.pack("<I", len(data)) + data)
        except OSError:
            return
        finally:
            os.close(fd)


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def serve(args):
    host, port = args.listen.rsplit(":", 1)
    srv = Server((host, int(port)), Handler)
    srv.root = args.root
    print(f"seq_reader serving {args.root} on {args.listen}", flush=True)
    srv.serve_forever()


def read(args):
    host, port = args.connect.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=max(30.0, args.max_seconds))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    p = args.path.encode()
    sock.sendall(struct.pack("<I", len(p)) + p)
    buf = bytearray(args.bs)
    total = 0
    complete = 0
    t0 = time.monotonic()
    deadline = t0 + args.max_seconds
    while True:
        if time.monotonic() >= deadline:
            break
        sock.sendall(struct.pack("<QI", total, args.bs))
        (n,) = struct.unpack("<I", recv_exact(sock, 4))
        if n:
            recv_exact(sock, n, buf)
        total += n
        if n < args.bs:
            complete = 1
            break
    dt = time.monotonic() - t0
    sock.close()
    print(f"{total} {dt:.6f} {complete}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--listen", required=True)
    s.add_argument("--root", required=True)
    r = sub.add_parser("read")
    r.add_argument("--connect", required=True)
    r.add_argument("--path", required=True)
    r.add_argument("--bs", type=int, default=65536)
    r.add_argument("--max-seconds", type=float, default=15.0)
    args = ap.parse_args()
    if args.cmd == "serve":
        serve(args)
    else:
        read(args)


if __name__ == "__main__":
    sys.exit(main())
