#!/usr/bin/env python3
"""Where the start of a read at site B goes, from the trace logs of B's mount and B's node.

Run bench/wan-read.sh with
  LOCUS_LOG=warn,locus=info,meta=info,node=info,fuse=trace,client::meta_link=trace,client::data=trace,node::site=trace
exported (every process inherits it; only B's mount and B's node write these lines), then

  wan_startup.py WORK/logs/mount-b.err WORK/logs/node-b.err [--name big2] [--secs 3]

It takes the last kernel LOOKUP of NAME in the mount's log (by default the warm read's file) as
time zero and prints when the read's first steps happened, then per quarter second how many
bytes of chunks B's node received from the other site, the most fetches it had in flight as
those fetches began, and their median duration.
"""

import argparse
import datetime
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+)Z\s+\w+\s+(\S+?):\s(.*)$")
CHUNK = 4 << 20


def events(path):
    """(seconds since the epoch, target, message) of every line of a tracing log."""
    with open(path, errors="replace") as f:
        for line in f:
            m = STAMP.match(ANSI.sub("", line).rstrip("\n"))
            if m:
                when = datetime.datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
                yield when, m.group(2), m.group(3)


def field(text, name):
    m = re.search(rf"\b{name}=(\d+)", text)
    return int(m.group(1)) if m else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mount_log")
    ap.add_argument("node_log")
    ap.add_argument("--name", default="big2")
    ap.add_argument("--secs", type=float, default=3.0)
    args = ap.parse_args()

    mount = list(events(args.mount_log))
    lookups = [t for t, _, msg in mount if f'LOOKUP name "{args.name}"' in msg]
    if not lookups:
        print(f"wan_startup: no LOOKUP of {args.name} in {args.mount_log} (was LOCUS_LOG set?)", file=sys.stderr)
        return 1
    t0 = lookups[-1]
    after = [(t - t0, target, msg) for t, target, msg in mount if t >= t0]

    def first(pred):
        return next((t for t, target, msg in after if pred(target, msg)), None)

    node = [(t - t0, msg) for t, target, msg in events(args.node_log) if t >= t0 and target == "node::site" and msg.startswith("fetched")]
    client = [t for t, target, msg in after if target == "client::data" and msg.startswith("fetched")]
    steps = [
        ("the kernel's LOOKUP", 0.0),
        ("its OPEN (after the Lookup's round trip to meta)", first(lambda _, m: " OPEN " in m)),
        ("its first READ (after the Open's round trip)", first(lambda _, m: " READ " in m)),
        ("the first chunk at B's node", node[0][0] if node else None),
        ("the first chunk at the mount", client[0] if client else None),
        ("the 8th chunk at B's node", node[7][0] if len(node) > 7 else None),
        ("the 32nd chunk at B's node", node[31][0] if len(node) > 31 else None),
    ]
    started = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    print(f"Start of the read of {args.name} ({started}; {args.mount_log}, {args.node_log}):")
    print("seconds after the kernel's LOOKUP of it, from the mount's and the node's trace lines (one clock).")
    print()
    print("| step | s |")
    print("|---|---:|")
    for what, t in steps:
        print(f"| {what} | {'-' if t is None else f'{t:.3f}'} |")
    print()
    print("Chunks B's node received from the other site, per quarter second (whole chunks of 4 MiB, by the time each fetch ended),")
    print("the most fetches it had in flight as those began, and the median time one took.")
    print()
    print("| from s | to s | MB | MB/s | fetches in flight as they began, most | fetch ms, median |")
    print("|---:|---:|---:|---:|---:|---:|")
    step = 0.25
    for i in range(int(args.secs / step)):
        lo, hi = i * step, (i + 1) * step
        ended = [msg for t, msg in node if lo <= t < hi]
        mb = len(ended) * CHUNK / 1e6
        inflight = max((field(m, "fetching") or 0 for m in ended), default=0)
        ms = sorted(field(m, "ms") or 0 for m in ended)
        med = ms[len(ms) // 2] if ms else 0
        print(f"| {lo:.2f} | {hi:.2f} | {mb:.1f} | {mb / step:.0f} | {inflight} | {med} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
