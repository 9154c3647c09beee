#!/usr/bin/env python3
"""Plain TCP moving a file's worth of bytes: the yardstick for a cold read across a WAN.

Usage:
  tcp_copy.py recv --listen ADDR:PORT --bytes N --streams P     (prints "<t_last_byte>")
  tcp_copy.py send --to ADDR:PORT --bytes N --streams P [--cc bbr] [--max-pacing-rate B]  (prints "<t_start>")

The sender opens P fresh connections (congestion control --cc) and sends N bytes from
memory, 1 MiB at a time on whichever connection has room (as a parallel copy tool hands
out blocks, so one slow connection does not hold up the end); the receiver reads until every connection ends and prints
the wall-clock time of the last byte. Both run on one machine (in two network
namespaces), so the copy's time is t_last_byte - t_start: from the first connect to the
last byte delivered, handshakes and slow start included, as a reader's time includes its
open and its ramp. iperf3 cannot say this: with -n it stops when the sender has written
the bytes, with some still in flight, and with -O it leaves out its own start.
Standard library only.
"""

import argparse
import socket
import threading
import time

BUF = 1 << 20
# Linux's SO_MAX_PACING_RATE (bytes per second; not in Python's socket module).
SO_MAX_PACING_RATE = 47


def recv(args: argparse.Namespace) -> None:
    host, port = args.listen.rsplit(":", 1)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(args.streams)
    print("listening", flush=True)
    got = [0] * args.streams
    last = [0.0] * args.streams

    def drain(i: int, conn: socket.socket) -> None:
        buf = bytearray(BUF)
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                break
            got[i] += n
            last[i] = time.time()
        conn.close()

    threads = []
    for i in range(args.streams):
        conn, _ = srv.accept()
        t = threading.Thread(target=drain, args=(i, conn))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    if sum(got) != args.bytes:
        raise SystemExit(f"tcp_copy: received {sum(got)} bytes, expected {args.bytes}")
    print(f"{max(last):.6f}", flush=True)


def send(args: argparse.Namespace) -> None:
    host, port = args.to.rsplit(":", 1)
    data = memoryview(bytes(BUF))
    left = [args.bytes]
    taking = threading.Lock()
    start = time.time()

    def take() -> int:
        with taking:
            k = min(left[0], BUF)
            left[0] -= k
            return k

    def push() -> None:
        s = socket.socket()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, args.cc.encode())
        if args.max_pacing_rate:
            s.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, args.max_pacing_rate)
        s.connect((host, int(port)))
        while k := take():
            s.sendall(data[:k])
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        s.close()

    threads = [threading.Thread(target=push) for _ in range(args.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{start:.6f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--listen", required=True)
    s = sub.add_parser("send")
    s.add_argument("--to", required=True)
    s.add_argument("--cc", default="bbr")
    s.add_argument("--max-pacing-rate", type=int, default=0, help="bytes/s per connection (0: no cap)")
    for p in (r, s):
        p.add_argument("--bytes", type=int, required=True)
        p.add_argument("--streams", type=int, default=8)
    args = ap.parse_args()
    recv(args) if args.mode == "recv" else send(args)


if __name__ == "__main__":
    main()
