#!/usr/bin/env python3
"""What a transfer across the WAN emulator did over time: the rate it reached, when the
bottleneck dropped, and what each TCP connection of the sender was doing.

Usage (as root, while the transfer runs; stops at SIGTERM/SIGINT or after --max-secs):
  wan_timeline.py --control PATH --sender-ns NS --dst IP [--every 1.0]
                  [--pids NAME:PID,...] [--label TEXT] [--max-secs 120] >> timeline.txt

Every --every s it asks the forwarder (`locus-wan`'s control socket) for its counters of
the first direction (s0->s1, A->B) and reads `ss -tin` in the sender's namespace for its
connections to --dst. When stopped it prints one table: per window, the
MB/s the bottleneck released A->B, its tail drops and random losses, and how many of the
sender's connections to --dst moved data in that window, with their min/median/max MB/s
(from `bytes_acked`), congestion windows (packets), smoothed RTTs and BBR's bandwidth
estimate summed over the connections, how many of the connections that carried bulk data
(over 1 MB acked so far) sat in BBR's PROBE_RTT (a window of 4 packets for at least 200 ms) at
the window's end, and what held them back, as shares of their time: no
data to send (the application; `busy` is the time a connection had data in flight), the
receiver's window (`rwnd_limited`: the receiving end reads too slowly) or the sender's socket
buffer (`sndbuf_limited`); with --pids, the CPU each named process used (% of one
core: all its threads, and its busiest thread), and the machine's idle and stolen time. A read
that never ramps up, stalls half way, waits on one slow connection or on one busy thread looks
different here, where its average rate cannot tell.
Standard library only.
"""

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import tempfile
import time

STOP = False


def on_signal(_sig: int, _frame: object) -> None:
    global STOP
    STOP = True


def counters(control: str, me: socket.socket) -> dict[str, int]:
    """The A->B line of the forwarder's `stats` answer, as numbers."""
    me.sendto(b"stats", control)
    text = me.recv(65536).decode()
    for line in text.splitlines():
        if re.search(r"s0->\S*s1 ", line):
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
    raise RuntimeError(f"no s0->s1 line in the forwarder's stats: {text!r}")


def connections(ns: str, dst: str) -> dict[str, dict[str, float]]:
    """Per connection (local port -> remote port) of the sender to `dst`: the fields of
    `ss -tin` that say how it is doing."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "ss", "-tinH", "dst", dst],
        capture_output=True, text=True, timeout=5, check=False,
    ).stdout
    conns: dict[str, dict[str, float]] = {}
    key = None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            f = line.split()
            key = f"{f[3]}>{f[4]}" if len(f) >= 5 else None
            continue
        if key is None:
            continue
        c: dict[str, float] = {}
        for name, pat in (
            ("acked", r"bytes_acked:(\d+)"),
            ("cwnd", r"\bcwnd:(\d+)"),
            ("rtt", r"\brtt:([0-9.]+)"),
            ("retrans", r"retrans:\d+/(\d+)"),
            ("busy", r"\bbusy:(\d+)ms"),
            ("rwnd_limited", r"rwnd_limited:(\d+)ms"),
            ("sndbuf_limited", r"sndbuf_limited:(\d+)ms"),
        ):
            m = re.search(pat, line)
            if m:
                c[name] = float(m.group(1))
        m = re.search(r"bbr:\(bw:([0-9.]+)([KMG]?)bps", line)
        if m:
            c["bbr_bw"] = float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)] / 8
        # BBR's state, told by its gains: both 1 only in PROBE_RTT (cwnd held at 4 packets).
        m = re.search(r"pacing_gain:([0-9.]+),cwnd_gain:([0-9.]+)", line)
        if m:
            c["probe_rtt"] = float(float(m.group(1)) == 1.0 and float(m.group(2)) == 1.0)
        conns[key] = c
    return conns


TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, dict[str, int]]:
    """User + system ticks of a process so far: all its threads', and each thread's
    ((0, {}) once it is gone)."""
    def ticks(stat: str) -> int:
        with open(stat) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    try:
        total = ticks(f"/proc/{pid}/stat")
        threads = {}
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                threads[t] = ticks(f"/proc/{pid}/task/{t}/stat")
            except OSError:
                pass
        return total, threads
    except OSError:
        return 0, {}


def machine_ticks() -> tuple[int, int, int]:
    """(total, idle + iowait, steal) ticks of every core so far."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[:8]), v[3] + v[4], v[7]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--control", required=True)
    p.add_argument("--sender-ns", required=True)
    p.add_argument("--dst", required=True)
    p.add_argument("--every", type=float, default=1.0)
    p.add_argument("--pids", default="", help="NAME:PID,... processes whose CPU to show")
    p.add_argument("--label", default="")
    p.add_argument("--max-secs", type=float, default=120)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tmp = tempfile.mkdtemp(prefix="wan-timeline")
    me = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    me.bind(os.path.join(tmp, "c"))
    me.settimeout(2)
    t0 = time.monotonic()
    snaps = []  # (t, forwarder counters, connections, {name: process ticks}, machine ticks)
    # A process not running now (an empty or 0 pid) shows as using nothing.
    pids = [(name, int(pid or 0)) for name, pid in (w.split(":", 1) for w in args.pids.split(",") if ":" in w)]
    try:
        while not STOP and time.monotonic() - t0 < args.max_secs:
            t = time.monotonic() - t0
            cpu = {name: cpu_ticks(pid) if pid else (0, {}) for name, pid in pids}
            snaps.append((t, counters(args.control, me), connections(args.sender_ns, args.dst), cpu, machine_ticks()))
            time.sleep(max(0.0, args.every * len(snaps) - (time.monotonic() - t0)))
    finally:
        me.close()
        os.unlink(os.path.join(tmp, "c"))
        os.rmdir(tmp)
    report(args, snaps, [name for name, _ in pids])


def report(args: argparse.Namespace, snaps: list, names: list) -> None:
    print(f"## {args.label} (A->B at the bottleneck; sender's connections to {args.dst} from `ss -tin`)\n")
    cpu_heads = "".join(f" {n} CPU % (busiest thread) |" for n in names)
    print("| from s | to s | MB/s | tail drops | random losses | conns moving | per conn MB/s min / median / max "
          f"| cwnd pkts min / median / max | srtt ms median | BBR bw sum MB/s | bulk conns in PROBE_RTT | retransmits "
          f"| idle / rwnd / sndbuf-limited % |{cpu_heads} idle % | steal % |")
    print("|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|" + "---:|" * (len(names) + 2))
    # Windows of --every seconds, each from one connection snapshot to the next.
    for (ta, sa, ca, pa, ma), (tb, sb, cb, pb, mb) in zip(snaps, snaps[1:]):
        dt = max(tb - ta, 1e-9)
        mbs = (sb.get("released_bytes", 0) - sa.get("released_bytes", 0)) / dt / 1e6
        drops = sb.get("queue_drops", 0) - sa.get("queue_drops", 0)
        lost = sb.get("lost", 0) - sa.get("lost", 0)
        rates, cwnds, rtts, bws, retrans = [], [], [], 0.0, 0
        held = {"idle": 0.0, "rwnd_limited": 0.0, "sndbuf_limited": 0.0}
        for k, c in cb.items():
            before = ca.get(k, {})
            moved = c.get("acked", 0) - before.get("acked", 0)
            if moved > 0:
                rates.append(moved / dt / 1e6)
                cwnds.append(c.get("cwnd", 0))
                rtts.append(c.get("rtt", 0))
                bws += c.get("bbr_bw", 0)
                retrans += int(c.get("retrans", 0) - before.get("retrans", 0))
                ms = dt * 1000
                held["idle"] += max(0.0, ms - (c.get("busy", 0) - before.get("busy", 0))) / ms
                for why in ("rwnd_limited", "sndbuf_limited"):
                    held[why] += (c.get(why, 0) - before.get(why, 0)) / ms

        def three(v: list, digits: int) -> str:
            return " / ".join(f"{x:.{digits}f}" for x in (min(v), statistics.median(v), max(v))) if v else "-"

        cpus = ""
        for n in names:
            (total_a, threads_a), (total_b, threads_b) = pa[n], pb[n]
            busiest = max((v - threads_a.get(k, 0) for k, v in threads_b.items()), default=0)
            cpus += f" {100 * (total_b - total_a) / TICK / dt:.0f} ({100 * busiest / TICK / dt:.0f}) |"
        probing = sum(1 for c in cb.values() if c.get("acked", 0) > 1e6 and c.get("probe_rtt"))
        all_ticks = max(mb[0] - ma[0], 1)
        print(f"| {ta:.1f} | {tb:.1f} | {mbs:.1f} | {drops} | {lost} | {len(rates)} | {three(rates, 1)} | {three(cwnds, 0)} "
              f"| {statistics.median(rtts) if rtts else 0:.0f} | {bws / 1e6:.1f} | {probing} | {retrans} "
              f"| {' / '.join(f'{100 * v / max(len(rates), 1):.0f}' for v in held.values())} |{cpus}"
              f" {100 * (mb[1] - ma[1]) / all_ticks:.0f} | {100 * (mb[2] - ma[2]) / all_ticks:.0f} |")
    print()


if __name__ == "__main__":
    main()
