#!/usr/bin/env python3
"""Fails when an `unsafe` block in the workspace has no `// SAFETY:` comment.

A block counts as commented when the comment lines directly above the line that
holds `unsafe` (or above the statement it continues) contain `SAFETY:`.
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
block = re.compile(r"\bunsafe\s*\{")
missing = []
for path in sorted(root.glob("**/*.rs")):
    if "target" in path.relative_to(root).parts:
        continue
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not block.search(line.split("//")[0]):
            continue
        j, found = i - 1, "SAFETY:" in line
        # Walk up over comments and over lines the statement continues from.
        while j >= 0 and not found:
            above = lines[j].strip()
            if above.startswith("//"):
                found = "SAFETY:" in above
            elif not (above.endswith(("(", ",", "=", "=>", "&&", "||")) or above.startswith((".", ")"))):
                break
            j -= 1
        if not found:
            missing.append(f"{path.relative_to(root)}:{i + 1}: {line.strip()}")
if missing:
    print("unsafe blocks without a `// SAFETY:` comment:")
    print("\n".join(missing))
    sys.exit(1)
