#!/usr/bin/env python3
"""Random whole-chunk reads of a file: how long one lone read of a chunk takes.

Usage: random_reads.py FILE --count N [--chunk BYTES] [--seed S]

Reads N distinct chunk-aligned ranges of --chunk bytes (4 MiB by default, Locus's chunk
size) in a seeded random order, one at a time, each with one pread(2) of the whole range,
and times each. Over a WAN each read of a chunk not cached at the reader's site is a lone
fetch from the other site: its round trip plus its transfer on the site node's connections.

Prints one line: "<median ms> <min ms> <max ms> <reads>". Standard library only.
"""

import argparse
import os
import random
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--chunk", type=int, default=4 << 20)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    fd = os.open(args.file, os.O_RDONLY)
    try:
        chunks = os.fstat(fd).st_size // args.chunk
        if chunks < args.count:
            print(f"random_reads: {args.file} holds {chunks} whole chunks, fewer than {args.count}", file=sys.stderr)
            return 1
        picks = random.Random(args.seed).sample(range(chunks), args.count)
        times = []
        for i in picks:
            t0 = time.perf_counter()
            got = os.pread(fd, args.chunk, i * args.chunk)
            times.append((time.perf_counter() - t0) * 1000)
            if len(got) != args.chunk:
                print(f"random_reads: short read at chunk {i}: {len(got)} bytes", file=sys.stderr)
                return 1
    finally:
        os.close(fd)
    print(f"{statistics.median(times):.1f} {min(times):.1f} {max(times):.1f} {len(times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
