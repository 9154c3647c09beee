#!/usr/bin/env python3
"""Metadata micro-benchmark: create, stat, list and unlink N small files in one directory.

Usage: meta_bench.py DIR [--files N] [--bytes B] [--settle SECONDS] [--phases create,stat,unlink]

Each phase runs over all N names in order and is timed on its own:
  create: open(O_CREAT|O_EXCL|O_WRONLY), write B bytes if B > 0, close
  stat:   os.stat (a FUSE LOOKUP once the kernel's entry TTL has run out)
  list:   what `ls -l` does: read the directory, then lstat every entry it names
          (not in the default phases)
  unlink: os.unlink
Between phases it sleeps --settle seconds (default 1.2, above the 1 s entry/attr TTL of the
FUSE mounts under test) so that stat and unlink reach the file system daemon instead of being
served from the kernel's dentry/attribute cache.

--phases runs a subset (e.g. `create`, then `stat` and `unlink` in later runs: used to profile one
phase at a time); without `create` the files must exist already.

Prints one line such as `create_per_s=... stat_per_s=... unlink_per_s=...`. Standard library only.
"""

import argparse
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--settle", type=float, default=1.2)
    ap.add_argument("--phases", default="create,stat,unlink")
    args = ap.parse_args()

    phases = args.phases.split(",")
    unknown = set(phases) - {"create", "stat", "list", "unlink"}
    if unknown:
        print(f"meta_bench: unknown phase(s) {sorted(unknown)}", file=sys.stderr)
        return 2
    os.makedirs(args.dir, exist_ok=True)
    if "create" in phases and os.listdir(args.dir):
        print(f"meta_bench: {args.dir} is not empty", file=sys.stderr)
        return 1
    names = [os.path.join(args.dir, f"f{i:06d}") for i in range(args.files)]
    payload = b"x" * args.bytes
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)

    def create() -> None:
        for name in names:
            fd = os.open(name, flags, 0o644)
            if payload:
                os.write(fd, payload)
            os.close(fd)

    def stat() -> None:
        for name in names:
            st = os.stat(name)
            if st.st_size != args.bytes:
                raise SystemExit(f"meta_bench: {name} has size {st.st_size}, wanted {args.bytes}")

    def listing() -> None:
        seen = 0
        with os.scandir(args.dir) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                if st.st_size != args.bytes:
                    raise SystemExit(f"meta_bench: {entry.path} has size {st.st_size}, wanted {args.bytes}")
                seen += 1
        if seen != args.files:
            raise SystemExit(f"meta_bench: {args.dir} lists {seen} entries, wanted {args.files}")

    def unlink() -> None:
        for name in names:
            os.unlink(name)

    results = []
    for i, phase in enumerate(phases):
        if phase != "create":
            # Let the kernel's entry/attribute TTL run out (fresh names need no settling).
            time.sleep(args.settle)
        t0 = time.perf_counter()
        {"create": create, "stat": stat, "list": listing, "unlink": unlink}[phase]()
        elapsed = time.perf_counter() - t0
        results.append(f"{phase}_per_s={args.files / elapsed:.0f}")
    print(" ".join(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
