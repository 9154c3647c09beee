#!/usr/bin/env python3
"""Fails when Cargo.toml's rust-version is not true: when a dependency in Cargo.lock
declares a higher rust-version than the workspace's, or a member declares another.

Toolchains cannot be downloaded in CI, so the minimum is not built; this reads what
every locked package declares (`cargo metadata`, host platform only, no network).
"""
import json
import pathlib
import subprocess
import sys
import tomllib

root = pathlib.Path(__file__).resolve().parent.parent


def version(text):
    parts = [int(x) for x in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


manifest = tomllib.loads((root / "Cargo.toml").read_text())
declared = manifest["workspace"]["package"]["rust-version"]
ours = version(declared)
host = next(
    line.split(": ", 1)[1]
    for line in subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout.splitlines()
    if line.startswith("host: ")
)
meta = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", host],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
)
members = set(meta["workspace_members"])
problems = []
for p in meta["packages"]:
    rv = p.get("rust_version")
    if p["id"] in members:
        if rv is None:
            problems.append(f"member {p['name']} does not inherit it: add `rust-version.workspace = true`")
        elif version(rv) != ours:
            problems.append(f"member {p['name']} declares rust-version {rv}")
    elif rv is not None and version(rv) > ours:
        problems.append(f"{p['name']} {p['version']} needs Rust {rv}")
if problems:
    print(f"Cargo.toml says rust-version = \"{declared}\", but:")
    print("\n".join("  " + x for x in problems))
    sys.exit(1)
print(f"rust-version {declared}: every locked dependency fits")
