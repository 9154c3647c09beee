#!/usr/bin/env python3
"""Builds bench/results/wan-seeds.md and the wan-seeds-*.png plots from the raw rows that
bench/wan-seeds.sh collects (a TSV: exp rtt loss conns system bytes secs complete wan note;
iperf3 rows carry bytes/s in `bytes` and 1 in `secs`). Also copies the TSV next to the
Markdown file so the figures can be re-plotted without rerunning.

  wan_seeds_report.py --tsv results.tsv --info info.txt --out bench/results/wan-seeds.md \
      [--foundation bench/results/foundation.md]
"""
import argparse
import os
import re
import shlex
import shutil

MB = 1e6


def load_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) < 9:
                continue
            p += [""] * (10 - len(p))
            exp, rtt, loss, conns, system, nbytes, secs, complete, wan, note = p[:10]
            try:
                r = dict(exp=exp, rtt=float(rtt), loss=float(loss), conns=conns, system=system,
                         bytes=float(nbytes), secs=float(secs), complete=complete == "1",
                         wan=float(wan), note=note)
            except ValueError:
                continue
            r["mbs"] = r["bytes"] / r["secs"] / MB if r["secs"] > 0 and r["bytes"] > 0 else None
            rows.append(r)
    return rows


def load_info(path):
    info = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                info[k] = v
    return info


def foundation_read(path):
    """Locus cold sequential read, bs=64k, median MB/s, from the foundation benchmark."""
    try:
        text = open(path).read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("| Seq read cold, bs=64k"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            m = re.match(r"([0-9.]+)", cells[3]) if len(cells) > 3 else None
            return float(m.group(1)) if m else None
    return None


def find(rows, **kw):
    out = [r for r in rows if all(r[k] == v for k, v in kw.items())]
    return out[-1] if out else None


def fmt(x, nd=1):
    if x is None:
        return "n/a"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.{nd}f}"
    return f"{x:.2f}"


def pct(x):
    return "n/a" if x is None else f"{100 * x:.0f}%"


def ratio(a, b):
    return a / b if a is not None and b else None


def eq1(rtt_ms, d_bytes, b_bytes):
    """Seed 000 eq. 1: T <= B / (1 + R*B/D), in bytes/s."""
    return b_bytes / (1 + (rtt_ms / 1000.0) * b_bytes / d_bytes)


def rate_cell(r, size):
    """MB/s; '(partial)' when the run was capped before the end of the file."""
    if r is None:
        return "n/a"
    if r["mbs"] is None:
        return "failed"
    return fmt(r["mbs"]) + ("" if r["complete"] else " (capped)")


def time_cell(r, size):
    """Seconds for the whole file; extrapolated from the rate when the run was capped."""
    if r is None or r["mbs"] is None:
        return "n/a"
    if r["complete"]:
        return fmt(r["secs"])
    return "~" + fmt(size / (r["mbs"] * MB)) + " (extrap.)"


def readahead_window(mount_args):
    # The build defaults (`locus mount --readahead-chunks`, `--chunk-size`).
    chunks, chunk = 32, 4 << 20
    a = shlex.split(mount_args or "")
    for i, x in enumerate(a):
        val = x.split("=", 1)[1] if "=" in x else (a[i + 1] if i + 1 < len(a) else "")
        if x.startswith("--readahead-chunks"):
            chunks = int(val)
        elif x.startswith("--chunk-size"):
            m = re.match(r"([0-9.]+)\s*([kKmMgG]?)", val)
            if m:
                chunk = int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()])
    return chunks, chunk


def conn_desc(info):
    f = info.get("conn_flag", "none")
    if f == "none":
        return "none"
    return f"`locus {info.get('conn_role')} {f} N` (default {info.get('conn_default') or '?'})"


def locus_default_b(rows, loss, info):
    r = find(rows, exp="b", loss=loss, system="locus", conns="default")
    if r is None and info.get("conn_default"):
        r = find(rows, exp="b", loss=loss, system="locus", conns=info["conn_default"])
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tsv", required=True)
    ap.add_argument("--info", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--foundation", default="")
    a = ap.parse_args()

    rows = load_rows(a.tsv)
    info = load_info(a.info)
    size_mb = int(info.get("size_mb", "1024"))
    size = size_mb * 1048576
    rate = float(info.get("rate", "1000"))
    bw = rate * 1e6 / 8  # B of eq. 1, bytes/s
    rtts = [float(x) for x in info.get("rtts", "").split()]
    losses = [float(x) for x in info.get("losses", "").split()]
    conns = info.get("conns", "").split()
    copy_rtts = [float(x) for x in info.get("copy_rtts", "").split()]
    loss_rtt = float(info.get("loss_rtt", "100"))
    ra_chunks, chunk = readahead_window(info.get("mount_args", ""))
    window = ra_chunks * chunk
    found = foundation_read(a.foundation) if a.foundation else None
    base = os.path.splitext(a.out)[0]
    outdir = os.path.dirname(a.out) or "."
    quick = size_mb < 1024

    L = []
    w = L.append
    w("# Locus wide-area benchmark: seed 000 (YottaYotta) figs. 3-6")
    w("")
    if quick:
        w(f"> **QUICK RUN (SIZE_MB={size_mb}), made to prove the script works end to end. "
          "The lead reruns `bench/wan-seeds.sh` at the default 1 GiB; do not quote these figures as the result.**")
        w("")
    w(f"- Date: {info.get('date')}; kernel {info.get('kernel')}; CPU {info.get('cpu')}; RAM {info.get('ram')}; "
      f"load average at the end {info.get('loadavg')} (shared, noisy host)")
    w(f"- Locus: commit {info.get('locus_rev')}; binary built {info.get('locus_built')}; mount flags "
      f"`{info.get('mount_args') or '(defaults)'}`, node flags `{info.get('node_args') or '(defaults)'}`; "
      f"client read-ahead window {ra_chunks} x {chunk >> 20} MiB = {window >> 20} MiB; "
      f"site cache directory (node data dir `cache/`) present: {info.get('node_cache_dir')}; "
      f"connection-count option: {conn_desc(info)}")
    w(f"- WAN: `locus-wan` (bench/results/wan-emulator.md), 2 site namespaces, {rate:.0f} Mbit/s per direction "
      f"(the forwarder's own ceiling is 3.5-4.9 Gbit/s, above it), MTU {info.get('mtu')}, delay = RTT/2 each way, "
      f"queue 1.5 x BDP; TCP congestion control in the namespaces: {info.get('cc')}")
    w(f"- Placement: meta + node at site A (10.99.0.1), node + mount at site B (10.99.0.2); every daemon inside its "
      f"site's namespace. File: {size_mb} MiB of random data, written once at A through a Locus mount at A "
      f"(and, for sshfs/scp/rsync/xrdcp/GridFTP/serial reader, the same bytes as a plain file on A's disk)")
    w(f"- Reads: `dd bs=64k`, cold: page cache dropped, a new `locus mount` process at B (empty client cache), B's "
      f"node restarted with its `cache/` removed; FUSE bdi read_ahead_kb = {info.get('ra_kb')} on every FUSE mount "
      f"(Locus and sshfs, as bench/run.sh). MB/s = 10^6 bytes/s. Caps: Locus/sshfs read {info.get('read_timeout')} s "
      f"({info.get('b_timeout')} s in b), serial reader {info.get('serial_secs')} s, copy {info.get('copy_timeout')} s; "
      f"a capped run reports its rate so far, and its time for the whole file is extrapolated (\"extrap.\")")
    w(f"- iperf3: A -> B, {info.get('iperf_secs')} s after {info.get('iperf_omit')} s omitted (slow start), "
      f"receiver's rate, congestion control {info.get('iperf_cc')} (Locus's own default; b adds -P 8 with cubic "
      f"for context); the same emulated path as Locus")
    w(f"- eq. 1 (seed 000): T <= B/(1+R*B/D), B = {rate:.0f} Mbit/s = {bw / MB:.0f} MB/s, R = RTT, D = bytes per "
      f"round trip: 64 KiB for a one-request-at-a-time reader; the client's read-ahead window ({window >> 20} MiB) "
      f"for a pipelined reader")
    w("")

    # ---------------- a
    w("## a. Read a file that lives only at site A, from one reader at site B (fig. 3)")
    w("")
    w("| RTT (ms) | iperf3 -P 8 (MB/s) | Locus (MB/s) | Locus time (s) | Locus / iperf3 -P 8 | Locus WAN bytes / file "
      "| sshfs (MB/s) | sshfs time (s) | serial 64 KiB (MB/s) | serial time (s) | eq. 1, D = 64 KiB (MB/s) "
      f"| eq. 1, D = {window >> 20} MiB (MB/s) |")
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rtt in rtts:
        ip = find(rows, exp="a", rtt=rtt, system="iperf3")
        lo = find(rows, exp="a", rtt=rtt, system="locus")
        ss = find(rows, exp="a", rtt=rtt, system="sshfs")
        se = find(rows, exp="a", rtt=rtt, system="serial")
        ipm = ip["mbs"] if ip else None
        lom = lo["mbs"] if lo else None
        wanf = (lo["wan"] / lo["bytes"]) if lo and lo["wan"] >= 0 and lo["bytes"] > 0 else None
        w(f"| {rtt:g} | {fmt(ipm)} | {rate_cell(lo, size)} | {time_cell(lo, size)} | {pct(ratio(lom, ipm))} "
          f"| {pct(wanf) if wanf is None else f'{wanf:.3f}'} | {rate_cell(ss, size)} | {time_cell(ss, size)} "
          f"| {rate_cell(se, size)} | {time_cell(se, size)} | {fmt(eq1(rtt, 65536, bw) / MB)} "
          f"| {fmt(eq1(rtt, window, bw) / MB)} |")
    notes = [r for r in rows if r["exp"] == "a" and r["note"] and r["mbs"] is None]
    for r in notes:
        w(f"\n- {r['system']} at {r['rtt']:g} ms: {r['note']}")
    w("")
    w("\"Locus WAN bytes / file\": bytes the forwarder carried A -> B during the read, over the bytes read "
      "(1.0 = every byte crossed once; frame headers and TCP/RPC overhead add ~1%).")
    w("")

    # ---------------- b
    w(f"## b. Steady throughput at {loss_rtt:g} ms RTT versus loss (fig. 4)")
    w("")
    have_conn = info.get("conn_flag", "none") != "none"
    hdr = "| loss % | " + " | ".join(f"iperf3 -P {p}" for p in conns) + " | iperf3 -P 8 cubic | Locus (build default) | " + \
        " | ".join(f"Locus {p} conn." for p in conns) + " | Locus / iperf3 -P 8 |"
    w(hdr)
    w("|" + "---:|" * (3 + 2 * len(conns) + 1))
    for loss in losses:
        cells = []
        for p in conns:
            r = find(rows, exp="b", loss=loss, system="iperf3", conns=p)
            cells.append(fmt(r["mbs"]) if r else "n/a")
        cub = find(rows, exp="b", loss=loss, system="iperf3-cubic", conns="8")
        dflt = locus_default_b(rows, loss, info)
        lcells = []
        for p in conns:
            r = find(rows, exp="b", loss=loss, system="locus", conns=p)
            lcells.append(rate_cell(r, size) if r else "n/a")
        ref = find(rows, exp="b", loss=loss, system="iperf3", conns="8")
        best = dflt
        if not best:
            cand = [r for r in rows if r["exp"] == "b" and r["loss"] == loss and r["system"] == "locus" and r["mbs"]]
            best = max(cand, key=lambda r: r["mbs"]) if cand else None
        w(f"| {loss:g} | " + " | ".join(cells) + f" | {fmt(cub['mbs']) if cub else 'n/a'} | {rate_cell(dflt, size) if dflt else 'n/a'} | " +
          " | ".join(lcells) + f" | {pct(ratio(best['mbs'] if best else None, ref['mbs'] if ref else None))} |")
    w("")
    if not have_conn:
        w("This build of `locus` has no connection-count option (`locus mount --help` and `locus node --help` list none "
          "matching `--*conn*`), so Locus is measured at its default and the per-connection cells are n/a. "
          "The script picks such an option up by itself when it exists.")
    else:
        w(f"Locus per connection count: {conn_desc(info)}; the default column repeats the cell of the default count.")
    w("Locus in b is a cold read of the file (capped), i.e. its average including start-up, not only the steady part.")
    w("")

    # ---------------- c
    w("## c. Copy the file from site A to site B (figs. 5-6)")
    w("")
    w("| RTT (ms) | tool | time (s) | MB/s | WAN bytes / file | note |")
    w("|---:|---|---:|---:|---:|---|")
    for rtt in copy_rtts:
        ip = find(rows, exp="c", rtt=rtt, system="iperf3")
        if ip:
            w(f"| {rtt:g} | *iperf3 -P 8 (reference)* | *{fmt(size / (ip['mbs'] * MB)) if ip['mbs'] else 'n/a'}* "
              f"| *{fmt(ip['mbs'])}* | | transport only |")
        for r in [r for r in rows if r["exp"] == "c" and r["rtt"] == rtt and r["system"] != "iperf3"]:
            wanf = f"{r['wan'] / size:.3f}" if r["wan"] >= 0 else "n/a"
            w(f"| {rtt:g} | {r['system']} | {time_cell(r, size)} | {rate_cell(r, size)} | {wanf} | {r['note']} |")
    w("")
    w("Sources: scp/rsync (over ssh, sshd at A), xrdcp (xrootd at A, serving A's disk as nobody), globus-url-copy -p 8 "
      "(globus-gridftp-server at A, anonymous `-aa` inside the emulated namespaces only) read the plain file on A's "
      "disk and write to B's disk (page cache, no fsync). \"cp Locus->B disk\" reads the Locus file through the mount at "
      "B and writes to B's disk like the others; \"cp Locus->Locus B\" writes a new Locus file at B (its close waits "
      "until every chunk is stored and fsynced on B's node and committed at meta). Page cache dropped before each copy.")
    w("")

    # ---------------- d
    w("## d. A second reader at site B after the first")
    w("")
    local = find(rows, exp="local", system="locus-site-a")
    lm = local["mbs"] if local else None
    w(f"Single-site references: foundation benchmark (bench/results/foundation.md, Locus cold seq read bs=64k, median) "
      f"**{fmt(found) if found else 'n/a'} MB/s**; this run's cold read at site A of the same file through a Locus mount "
      f"at A: **{fmt(lm)} MB/s**.")
    w("")
    w("| RTT (ms) | first reader (MB/s) | second reader (MB/s) | second / first | second / foundation single-site "
      "| second / this run's site-A read | WAN bytes A->B in second read | WAN bytes / file |")
    w("|---:|---:|---:|---:|---:|---:|---:|---:|")
    d_rows = []
    for rtt in rtts:
        f1 = find(rows, exp="a", rtt=rtt, system="locus")
        f2 = find(rows, exp="d", rtt=rtt, system="locus-second")
        m1 = f1["mbs"] if f1 else None
        m2 = f2["mbs"] if f2 else None
        wanf = f2["wan"] / size if f2 and f2["wan"] >= 0 else None
        d_rows.append((rtt, m1, m2, wanf))
        w(f"| {rtt:g} | {rate_cell(f1, size)} | {rate_cell(f2, size)} | {pct(ratio(m2, m1))} | {pct(ratio(m2, found))} "
          f"| {pct(ratio(m2, lm))} | {int(f2['wan']) if f2 and f2['wan'] >= 0 else 'n/a'} "
          f"| {'n/a' if wanf is None else f'{100 * wanf:.2f}%'} |")
    w("")
    w("Second reader: a new `locus mount` process at B (empty client cache) after the page cache is dropped; B's node "
      "and whatever it keeps (site cache) are left as the first reader left them. WAN bytes: the forwarder's "
      "`released_bytes` A -> B before/after the read (`locus-wan ctl ... stats`).")
    w("")

    # ---------------- goals
    w("## Goals")
    w("")
    w("| goal | measured | target | met |")
    w("|---|---:|---:|:---:|")
    g_lo = locus_default_b(rows, 0.5, info)
    g_ip = find(rows, exp="b", loss=0.5, system="iperf3", conns="8")
    g = ratio(g_lo["mbs"] if g_lo else None, g_ip["mbs"] if g_ip else None)
    w(f"| (a) Locus, one reader at B, {loss_rtt:g} ms RTT, 0.5% loss / iperf3 -P 8 on the same path "
      f"({fmt(g_lo['mbs'] if g_lo else None)} / {fmt(g_ip['mbs'] if g_ip else None)} MB/s) | {pct(g)} | >= 90% "
      f"| {'n/a' if g is None else ('yes' if g >= 0.9 else 'no')} |")
    flat = [(rtt, find(rows, exp="a", rtt=rtt, system="locus")) for rtt in rtts if 10 <= rtt <= 200]
    flat = [(rtt, r["mbs"]) for rtt, r in flat if r and r["mbs"]]
    if flat:
        lo_, hi_ = min(m for _, m in flat), max(m for _, m in flat)
        fr = lo_ / hi_
        w(f"| (a) flat from 10 to 200 ms: slowest / fastest Locus read over RTT {', '.join(f'{r:g}' for r, _ in flat)} ms "
          f"({fmt(lo_)} / {fmt(hi_)} MB/s) | {pct(fr)} | >= 90% | {'yes' if fr >= 0.9 else 'no'} |")
    d_ok = [x for x in d_rows if x[2] is not None]
    if d_ok:
        worst = min(d_ok, key=lambda x: x[2])
        gr = ratio(worst[2], found)
        w(f"| (d) second reader / foundation single-site read ({fmt(found)} MB/s), worst RTT ({worst[0]:g} ms) "
          f"| {pct(gr)} | >= 80% | {'n/a' if gr is None else ('yes' if gr >= 0.8 else 'no')} |")
        wn = [x for x in d_ok if x[3] is not None]
        if wn:
            worstw = max(wn, key=lambda x: x[3])
            w(f"| (d) file bytes crossing the WAN again in the second read, worst RTT ({worstw[0]:g} ms) "
              f"| {100 * worstw[3]:.2f}% | < 1% | {'yes' if worstw[3] < 0.01 else 'no'} |")
    w("")
    if quick:
        w(f"Quick run: at {size_mb} MiB slow start and the first round trips weigh far more than at 1 GiB, so every "
          "WAN figure here is below what the full run measures; only the full run judges the goals.")
        w("")
    fails = []
    for k, name in (("sshd_ok", "sshd (sshfs, scp, rsync)"), ("xrootd_ok", "xrootd"), ("gridftp_ok", "GridFTP")):
        if info.get(k) == "0":
            fails.append(name)
    if fails:
        w("Tools that could not be started: " + ", ".join(fails) + " (their rows carry the error).")
        w("")
    w("Plots: " + ", ".join(f"`{os.path.basename(base)}-{n}.png`" for n in ("fig3", "fig4", "fig56", "d")) + ".")
    w("")
    w(f"Generated by `bench/wan-seeds.sh` in {info.get('elapsed')} s; raw rows in `{os.path.basename(base)}.tsv`.")
    with open(a.out, "w") as f:
        f.write("\n".join(L) + "\n")
    shutil.copy(a.tsv, base + ".tsv")

    plots(rows, info, base, rtts, losses, conns, copy_rtts, size, size_mb, bw, window, loss_rtt, found, lm, quick)


def plots(rows, info, base, rtts, losses, conns, copy_rtts, size, size_mb, bw, window, loss_rtt, found, lm, quick):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots")
        return
    tag = f" (quick run, {size_mb} MiB)" if quick else f" ({size_mb} MiB)"

    # fig. 3: time to read and throughput vs RTT
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    xs = sorted(rtts)
    fine = [x / 2 for x in range(0, int(2 * max(xs or [1])) + 1)]
    series = [("Locus", "a", "locus", "o-", "C0"), ("sshfs", "a", "sshfs", "s-", "C1"),
              ("serial 64 KiB reader", "a", "serial", "^-", "C2"), ("iperf3 -P 8", "a", "iperf3", "x:", "C7")]
    for label, exp, system, style, color in series:
        pts = [(x, find(rows, exp=exp, rtt=x, system=system)) for x in xs]
        pts = [(x, r) for x, r in pts if r and r["mbs"]]
        if not pts:
            continue
        ax2.plot([x for x, _ in pts], [r["mbs"] for _, r in pts], style, color=color, label=label)
        if system != "iperf3":
            ax1.plot([x for x, _ in pts], [size / (r["mbs"] * MB) for _, r in pts], style, color=color, label=label)
    for d, label, color in ((65536, "eq. 1 bound, D = 64 KiB", "C3"), (window, f"eq. 1 bound, D = {window >> 20} MiB", "C4")):
        ax2.plot(fine, [eq1(x, d, bw) / MB for x in fine], "--", color=color, label=label)
        ax1.plot(fine, [size / eq1(x, d, bw) for x in fine], "--", color=color, label=label)
    ax1.set(xlabel="RTT (ms)", ylabel=f"time to read the file (s, log)", yscale="log",
            title="Fig. 3-like: time to read from site B" + tag)
    ax2.set(xlabel="RTT (ms)", ylabel="MB/s (log)", yscale="log", title="Throughput of one reader at B")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(base + "-fig3.png", dpi=110)
    plt.close(fig)

    # fig. 4: throughput vs loss per connection count
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    cub = [(l, find(rows, exp="b", loss=l, system="iperf3-cubic", conns="8")) for l in losses]
    cub = [(l, r["mbs"]) for l, r in cub if r and r["mbs"]]
    if cub:
        ax.plot([l for l, _ in cub], [m for _, m in cub], "x:", color="grey", label="iperf3 -P 8 cubic")
    for i, p in enumerate(conns):
        pts = [(l, find(rows, exp="b", loss=l, system="iperf3", conns=p)) for l in losses]
        pts = [(l, r["mbs"]) for l, r in pts if r and r["mbs"]]
        if pts:
            ax.plot([l for l, _ in pts], [m for _, m in pts], "o--", color=f"C{i}", alpha=0.8, label=f"iperf3 -P {p}")
        lp = [(l, find(rows, exp="b", loss=l, system="locus", conns=p)) for l in losses]
        lp = [(l, r["mbs"]) for l, r in lp if r and r["mbs"]]
        if lp:
            ax.plot([l for l, _ in lp], [m for _, m in lp], "s-", color=f"C{i}", lw=2, label=f"Locus {p} conn.")
    pts = [(l, locus_default_b(rows, l, info)) for l in losses]
    pts = [(l, r["mbs"]) for l, r in pts if r and r["mbs"]]
    if pts:
        ax.plot([l for l, _ in pts], [m for _, m in pts], "s-", color="k", lw=1, ms=9, mfc="none",
                label="Locus (build default)")
    ax.set(xlabel="packet loss (%)", ylabel="MB/s (log)", yscale="log",
           title=f"Fig. 4-like: steady throughput at {loss_rtt:g} ms RTT" + tag)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(base + "-fig4.png", dpi=110)
    plt.close(fig)

    # figs. 5-6: copy times per tool
    tools = []
    for r in rows:
        if r["exp"] == "c" and r["system"] != "iperf3" and r["system"] not in tools:
            tools.append(r["system"])
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / max(1, len(copy_rtts))
    for j, rtt in enumerate(copy_rtts):
        hs, hatches = [], []
        for t in tools:
            r = find(rows, exp="c", rtt=rtt, system=t)
            if r and r["mbs"]:
                hs.append(size / (r["mbs"] * MB))
                hatches.append("" if r["complete"] else "//")
            else:
                hs.append(float("nan"))
                hatches.append("")
        bars = ax.bar([i + (j - (len(copy_rtts) - 1) / 2) * width for i in range(len(tools))], hs, width,
                      label=f"RTT {rtt:g} ms", color=f"C{j}")
        for b, h in zip(bars, hatches):
            b.set_hatch(h)
        ip = find(rows, exp="c", rtt=rtt, system="iperf3")
        if ip and ip["mbs"]:
            ax.axhline(size / (ip["mbs"] * MB), color=f"C{j}", ls=":", lw=1, label=f"iperf3 -P 8 at {rtt:g} ms")
    ax.set_xticks(range(len(tools)))
    ax.set_xticklabels(tools, rotation=15, fontsize=8)
    ax.set(ylabel="time to copy the file (s, log)", yscale="log", title="Figs. 5-6-like: copy from site A to site B" + tag +
           "\n(hatched: capped, time extrapolated)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(base + "-fig56.png", dpi=110)
    plt.close(fig)

    # d: first vs second reader
    fig, ax = plt.subplots(figsize=(8, 4.6))
    xs = list(range(len(rtts)))
    f1 = [find(rows, exp="a", rtt=r, system="locus") for r in rtts]
    f2 = [find(rows, exp="d", rtt=r, system="locus-second") for r in rtts]
    ax.bar([x - 0.2 for x in xs], [r["mbs"] if r and r["mbs"] else 0 for r in f1], 0.4, label="first reader (cold)")
    bars = ax.bar([x + 0.2 for x in xs], [r["mbs"] if r and r["mbs"] else 0 for r in f2], 0.4, label="second reader")
    for b, r in zip(bars, f2):
        if r and r["wan"] >= 0:
            ax.annotate(f"WAN {100 * r['wan'] / size:.1f}%", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=7)
    if found:
        ax.axhline(found, color="C3", ls="--", label=f"foundation single-site read ({found:.0f} MB/s)")
        ax.axhline(0.8 * found, color="C3", ls=":", label="80% of it (goal)")
    if lm:
        ax.axhline(lm, color="C2", ls="--", label=f"this run, site-A read ({lm:.0f} MB/s)")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{r:g} ms" for r in rtts])
    ax.set(xlabel="RTT", ylabel="MB/s", title="d: second reader at site B" + tag)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(base + "-d.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
