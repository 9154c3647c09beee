#!/usr/bin/env python3
"""Fails when ARCHITECTURE.md's code map or two of its invariants no longer hold.

1. The code map's "depends on" column (its last) names, for each crate of crates/,
   exactly the workspace crates its Cargo.toml lists under [dependencies] (also
   target-specific ones; `x.workspace = true`, `x = { workspace = true, ... }`, a path
   dependency or a `[dependencies.x]` table; not dev- or build-dependencies), and every
   crate of crates/ has a row.
2. No bare spawned loop: a `tokio::spawn`, `tokio::task::spawn`, `thread::spawn` or
   `thread::Builder ... .spawn` whose body holds a `loop` or `while` (written in the
   call, or in a function of the same file the call names) is a background loop, and
   background loops are `util::worker::Worker`s. crates/util/src/worker.rs (the runner)
   is exempt.
   A justified exception carries `// map-check: not a worker (why)` in the comment lines
   directly above the spawn (the reason may run on over them); the exceptions are
   listed on every run.
3. No lock taken by hand: `.lock()`, `.read()` or `.write()` followed by `.unwrap()` or
   `.expect(`, or a poisoned lock recovered by hand (`unwrap_or_else(|e| e.into_inner())`,
   `Err(e) => e.into_inner()`, any `PoisonError`), outside crates/util/src/sync.rs:
   locks and condition-variable waits go through `util::sync::{lock, read, write, wait}`.
5. meta's backends keep to their rooms: outside test code, `meta::sqlite` and
   `meta::postgres` name only the seam (`store`, `error`, `locks`), never each other or
   the layers above; the seam names nothing else of meta; and only `engine` (which
   opens a backend by URL), `migrate` (which copies SQLite into PostgreSQL) and `moving`
   (which copies a metadata home's PostgreSQL database to another site's server) name
   a backend. A third backend is then one more room and one line in `open_store`.
4. bench/results/README.md names every file and directory of bench/results/ (each as
   `name` or `name/`), so the index of the measurements stays whole.

Test code is exempt from 2 and 3: files under a `tests/` or `benches/` directory, the
testkit crate, items under `#[cfg(test)]` (or a cfg that enables them for tests, such
as meta's conformance suite), and module files such an item declares. Only crates/ is
scanned: bench/passthrough is the benchmarks' baseline and deliberately shares nothing
with Locus.
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"map-check:\s*not a worker\s*\((.+)\)")
failures, exceptions = [], []


def rel(path):
    return path.relative_to(root)


# --- 1. The code map's dependency column against Cargo.toml --------------------------


def toml_sections(path):
    """Yields (section, stripped line) for each line of a Cargo.toml."""
    section = None
    for line in path.read_text().splitlines():
        text = line.split("#")[0].strip()
        if text.startswith("["):
            section = text.strip("[]").strip()
        elif text:
            yield section, text


crates = {}  # package name -> directory
for manifest in sorted(root.glob("crates/*/Cargo.toml")):
    for section, text in toml_sections(manifest):
        m = re.match(r'name\s*=\s*"([^"]+)"', text)
        if section == "package" and m:
            crates[m.group(1)] = manifest.parent
            break

deps = {}  # package name -> {workspace crate it depends on}
for name, directory in crates.items():
    found = set()
    for section, text in toml_sections(directory / "Cargo.toml"):
        table = re.fullmatch(r"(?:target\..+\.)?dependencies(?:\.([A-Za-z0-9_-]+))?", section or "")
        if not table:
            continue
        if table.group(1):  # [dependencies.x]: a workspace or path dependency on x
            if table.group(1) in crates and re.match(r"(workspace\s*=\s*true|path\s*=)", text):
                found.add(table.group(1))
            continue
        m = re.match(r'([A-Za-z0-9_-]+)\s*(\.\s*workspace\s*=\s*true|=\s*\{(.*)\})', text)
        if not m or m.group(1) not in crates:
            continue
        inline = m.group(3) or ""
        if m.group(2).startswith(".") or re.search(r"\bworkspace\s*=\s*true|\bpath\s*=", inline):
            found.add(m.group(1))
    deps[name] = found

arch = root / "ARCHITECTURE.md"
lines = arch.read_text().splitlines()
NO_CRATE = {"none", "nothing", "of", "ours", "—", "-"}  # words a row with no dependency may use
in_map, rows = False, {}
for n, line in enumerate(lines, 1):
    if line.startswith("## "):
        in_map = line.lower().startswith("## code map")
        continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
    if not in_map or len(cells) < 3:
        continue
    crate = cells[0].strip("`")
    if crate in ("crate", "") or set(crate) <= set("-: "):
        continue
    column = cells[-1]
    named = set(re.findall(r"`([A-Za-z0-9_-]+)`", column)) or set(re.findall(r"[A-Za-z0-9_-]+", column))
    rows[crate] = (n, named & set(crates), named - set(crates))
if not rows:
    failures.append(f"{rel(arch)}: no code map table found under a `## Code map` heading")
for crate, (n, named, unknown) in sorted(rows.items()):
    if crate not in crates:
        failures.append(f"{rel(arch)}:{n}: code map row `{crate}` names no crate of crates/")
        continue
    want, unknown = deps[crate], unknown - NO_CRATE
    if named != want or unknown:
        show = lambda s: ", ".join(sorted(s)) or "none"
        failures.append(
            f"{rel(arch)}:{n}: `{crate}` depends on {show(want)} "
            f"({rel(crates[crate] / 'Cargo.toml')} [dependencies]); the code map says {show(named | unknown)}"
        )
for crate in sorted(set(crates) - set(rows)):
    failures.append(f"{rel(arch)}: the code map has no row for `{crate}` ({rel(crates[crate])})")


# --- Reading Rust: code with comments and literals blanked, and test regions ---------


def blank(src):
    """`src` with comments and string/char literals replaced by spaces (newlines kept)."""
    out, i, n = list(src), 0, len(src)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(src, i)) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = src.find('"' + m.group(1), m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            wipe(m.end(), end - 1 - len(m.group(1)))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            wipe(i + 1, j)
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'); otherwise a lifetime or label.
            if i + 1 < n and src[i + 1] == "\\":
                j = src.find("'", i + 2)
                wipe(i + 1, j)
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'":
                wipe(i + 1, i + 2)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def closing(code, at):
    """Index of the bracket closing the one at `at`."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    for k in range(at, len(code)):
        ch = code[k]
        if ch in pairs:
            stack.append(pairs[ch])
        elif ch in ")}]":
            if stack and stack[-1] == ch:
                stack.pop()
            if not stack:
                return k
    return len(code) - 1


TEST_CFG = re.compile(r"#\[cfg\((.*?)\)\]", re.S)


def is_test_cfg(predicate):
    return bool(re.search(r"\btest\b", predicate)) and not re.search(r"not\s*\(\s*test\s*\)", predicate)


test_files = set()  # module files declared by a test-only `mod x;`


def test_spans(path, code):
    """Character spans of `code` that are test-only items."""
    spans = []
    for m in TEST_CFG.finditer(code):
        if not is_test_cfg(m.group(1)):
            continue
        k = m.end()
        # Skip further attributes, then find where the item's body starts or it ends.
        while True:
            rest = code[k:].lstrip()
            k = len(code) - len(rest)
            if rest.startswith("#["):
                k = closing(code, k + 1) + 1
            else:
                break
        brace, semi = code.find("{", k), code.find(";", k)
        if semi >= 0 and (brace < 0 or semi < brace):
            decl = re.match(r"(pub(\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code[k : semi + 1])
            if decl:
                here = path.parent if path.stem in ("lib", "main", "mod") else path.parent / path.stem
                test_files.add(here / f"{decl.group(3)}.rs")
                test_files.add(here / decl.group(3))
            spans.append((m.start(), semi))
        elif brace >= 0:
            spans.append((m.start(), closing(code, brace)))
    return spans


def is_test_path(path):
    parts = rel(path).parts
    if "tests" in parts or "benches" in parts or parts[:2] == ("crates", "testkit"):
        return True
    return any(path == t or t in path.parents for t in test_files)


# --- 2 and 3. Spawned loops and hand-taken locks --------------------------------------

SPAWN = re.compile(
    r"\b(?:tokio::(?:task::)?spawn|(?:std::)?thread::spawn)\s*\("
    r"|\bthread::Builder::new\s*\(\s*\)[^;]*?\.spawn\s*\("
)
LOCK = re.compile(
    r"\.(?:lock|read|write)\(\s*\)\s*\.\s*(?:unwrap\(\s*\)|expect\s*\()"
    r"|\bPoisonError\b"
    r"|unwrap_or_else\s*\(\s*\|\s*(\w+)\s*\|\s*\1\s*\.\s*into_inner\s*\(\s*\)"
    r"|Err\s*\(\s*(\w+)\s*\)\s*=>\s*\2\s*\.\s*into_inner\s*\(\s*\)"
)

# What each room of meta may name (check 5); a room not listed may name anything but a
# backend.
META = root / "crates" / "meta" / "src"
SEAM = {"store", "error", "locks"}
BACKENDS = {"sqlite", "postgres"}
MAY_NAME = {**{b: SEAM for b in BACKENDS}, **{s: SEAM for s in SEAM}}
NAMES_BACKENDS = {"engine", "migrate", "moving"}

# Declaration order matters: a `#[cfg(test)] mod x;` must be seen before x's file.
sources = sorted(root.glob("crates/**/*.rs"), key=lambda p: (len(p.parts), str(p)))
for path in sources:
    if "target" in rel(path).parts:
        continue
    src = path.read_text()
    code = blank(src)
    spans = test_spans(path, code)
    if is_test_path(path):
        continue
    raw = src.splitlines()
    line_of = lambda at: code.count("\n", 0, at) + 1
    in_test = lambda at: any(a <= at <= b for a, b in spans)
    where = lambda at: f"{rel(path)}:{line_of(at)}"

    if rel(path) != pathlib.Path("crates/util/src/worker.rs"):
        fns = {m.group(1): m.end() for m in re.finditer(r"\bfn\s+(\w+)\b[^;{]*\{", code)}
        for m in SPAWN.finditer(code):
            if in_test(m.start()):
                continue
            body = code[m.end() - 1 : closing(code, m.end() - 1) + 1]
            looped = re.search(r"\b(?:loop|while)\b", body)
            called = re.match(r"\(\s*(?:[\w:]+::)?(\w+)\s*[()]", body)
            if not looped and called and called.group(1) in fns:
                start = fns[called.group(1)] - 1
                looped = re.search(r"\b(?:loop|while)\b", code[start : closing(code, start) + 1])
            if not looped:
                continue
            line = line_of(m.start())
            above, j = [], line - 2
            while j >= 0 and raw[j].strip().startswith("//"):
                above.insert(0, raw[j].strip().lstrip("/").strip())
                j -= 1
            marked = MARKER.search(" ".join(above))
            spawn_text = raw[line - 1].strip()
            if marked:
                exceptions.append(f"{where(m.start())}: {marked.group(1)}")
            else:
                failures.append(
                    f"{where(m.start())}: a spawned loop outside a util::worker::Worker "
                    f"(or mark it `// map-check: not a worker (why)`): {spawn_text}"
                )

    if rel(path) != pathlib.Path("crates/util/src/sync.rs"):
        for m in LOCK.finditer(code):
            if not in_test(m.start()):
                line = line_of(m.start())
                failures.append(f"{where(m.start())}: a lock taken by hand, not through util::sync: {raw[line - 1].strip()}")

    if META in path.parents:
        room = path.relative_to(META).parts[0].removesuffix(".rs")
        for m in re.finditer(r"\bcrate::(\w+)", code):
            named = m.group(1)
            if in_test(m.start()) or named == room:
                continue
            allowed = MAY_NAME.get(room)
            if (allowed is not None and named not in allowed) or (
                named in BACKENDS and room not in NAMES_BACKENDS and allowed is None
            ):
                failures.append(
                    f"{where(m.start())}: meta::{room} names meta::{named}: backends name only the seam "
                    f"({', '.join(sorted(SEAM))}), and only {' and '.join(sorted(NAMES_BACKENDS))} name a backend"
                )

# --- 4. The index of bench/results/ ---------------------------------------------------

results = root / "bench" / "results"
if results.is_dir():
    index = results / "README.md"
    named = set(re.findall(r"`([^`\n]+)`", index.read_text())) if index.exists() else set()
    for entry in sorted(results.iterdir()):
        name = entry.name + ("/" if entry.is_dir() else "")
        if entry != index and name not in named:
            failures.append(f"{rel(index)}: `{name}` is not indexed (one line: what it measured, which script made it)")

if exceptions:
    print("spawned loops marked as not workers:")
    print("\n".join(f"  {e}" for e in exceptions))
if failures:
    # By file, then line.
    key = lambda f: (f.split(":")[0], int(f.split(":")[1]) if f.split(":")[1].isdigit() else 0)
    print("ARCHITECTURE.md's map or invariants do not hold:")
    print("\n".join(sorted(failures, key=key)))
    sys.exit(1)
