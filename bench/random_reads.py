#!/usr/bin/env python3
"""Random reads of a file, one chunk each: how long a read that needs a chunk takes.

Usage: random_reads.py FILE --count N [--size BYTES] [--chunk BYTES] [--seed S] [--fadvise-random]

Reads --size bytes (1 MiB by default: one FUSE request) at the start of N distinct chunks
of --chunk bytes (4 MiB, Locus's chunk size), in a seeded random order, one pread(2) at a
time, and times each. Every read jumps, so it starts no read-ahead: over a WAN each read
of a chunk not cached at the reader's site is one lone fetch from the other site (its round
trip plus the chunk's transfer on the site node's connections). A read of a whole chunk
(--size 4194304) is one fetch too, plus the next chunk, into which the kernel reads ahead,
unless --fadvise-random tells the kernel not to (posix_fadvise(POSIX_FADV_RANDOM)).

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
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--chunk", type=int, default=4 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fadvise-random", action="store_true")
    args = ap.parse_args()

    fd = os.open(args.file, os.O_RDONLY)
    try:
        if args.fadvise_random:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        chunks = os.fstat(fd).st_size // args.chunk
        if chunks < args.count:
            print(f"random_reads: {args.file} holds {chunks} whole chunks, fewer than {args.count}", file=sys.stderr)
            return 1
        picks = random.Random(args.seed).sample(range(chunks), args.count)
        times = []
        for i in picks:
            t0 = time.perf_counter()
            got = os.pread(fd, args.size, i * args.chunk)
            times.append((time.perf_counter() - t0) * 1000)
            if len(got) != args.size:
                print(f"random_reads: short read at chunk {i}: {len(got)} bytes", file=sys.stderr)
                return 1
    finally:
        os.close(fd)
    print(f"{statistics.median(times):.1f} {min(times):.1f} {max(times):.1f} {len(times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
