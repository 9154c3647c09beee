#!/usr/bin/env python3
"""Who calls a hot function: reads `perf script -F ip,sym` of a `perf record --call-graph dwarf`
profile on stdin and prints the hottest leaf functions, then, for the leaves matching
--leaf (a regex, e.g. "memcpy|memmove"), the first --depth frames of Locus's own code and the
libraries it drives (net::, node::, chunk::, client::, util::, rustls, bytes) above them,
grouped and counted. A flat profile says "15 % in memcpy"; this says whose copy it is.

Usage:  perf script -i perf.data -F ip,sym | perf_callers.py [--leaf REGEX] [--depth 4] [--top 12]
Standard library only.
"""

import argparse
import collections
import re
import sys

OURS = re.compile(r"(net::|node::|chunk::|client::|util::|rustls|bytes::|buf_reader|extend_from_slice|to_vec)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--leaf", default="memcpy|memmove")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    leaf = re.compile(args.leaf)
    leaves: collections.Counter = collections.Counter()
    callers: collections.Counter = collections.Counter()
    total = matched = 0
    for sample in re.split(r"\n\s*\n", sys.stdin.read()):
        # Each line: "<address> <symbol>"; the first is where the sample landed.
        syms = [line.strip().split(" ", 1)[-1] for line in sample.strip().splitlines() if line.strip()]
        if not syms:
            continue
        total += 1
        leaves[syms[0]] += 1
        if not leaf.search(syms[0]):
            continue
        matched += 1
        chain = [re.sub(r" \(inlined\)$", "", s)[:110] for s in syms[1:] if OURS.search(s)][: args.depth]
        callers[" <- ".join(chain) or "(no frame of ours)"] += 1
    print(f"{total} samples; hottest functions where they landed (% of samples):")
    for sym, n in leaves.most_common(args.top):
        print(f"  {100 * n / max(total, 1):5.1f} %  {sym}")
    print(f"\n{matched} samples ({100 * matched / max(total, 1):.1f} %) landed in /{args.leaf}/; called from "
          f"(% of those, innermost first):")
    for chain, n in callers.most_common(args.top):
        print(f"  {100 * n / max(matched, 1):5.1f} %  {chain}")


if __name__ == "__main__":
    main()
