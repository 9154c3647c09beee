#!/usr/bin/env bash
# Replication across sites on the repo's WAN emulator: two sites, A (10.99.0.1) and B
# (10.99.0.2), joined by `locus-wan` at RATE Mbit/s per direction; meta, a node and the
# writing mount at A, a node at B. Every daemon runs in a site namespace.
#
#   1. Sequential write of SIZE_MB (dd bs=1M conv=fsync) into a single-site directory (the
#      default policy) and into a `sync` a,b directory, at each RTT of RTTS, beside
#      iperf3 -P 8 on the same path; bytes crossing the WAN (forwarder counters).
#   2. A 4 KiB overwrite in the middle of the `sync` file (dd conv=notrunc,fsync): bytes
#      crossing the WAN A->B and B->A.
#   3. `async` a,b: the same write, then the time until B holds every chunk (the node's
#      replication lag metric back to 0).
#   4. (part lag) `async` a,b under a write paced at the link rate (LAG_MBIT, the link
#      set to the same rate, LAG_RTT) for LAG_SECS: the replication lag (queued chunks,
#      age of the oldest) sampled every second, its maximum against an RPO of 30 s.
#   5. (part nbd) `locus nbd` serving a SIZE_MB MiB export: at A in the single-site
#      directory, and at B (its meta at A) in the `sync` a,b directory; nbdcopy --flush of
#      a page-cached file of random bytes into each, at each RTT of RTTS (issue 40's goal:
#      at B, >= 80 % of min(link, single-site)).
#   6. (part repair) a third site r (namespace s2) with three nodes and its own mount:
#      REPAIR_MB written under the default policy (two copies at a three-node site), one
#      node killed (-9); the time until `locus fsck` finds every chunk at its copy count
#      again, and the repair rate (bytes the repair workers report / repair time).
# Writes bench/results/replication.md (the sections of the PARTS that ran).
#
# Usage (as root):  bench/replication.sh
#   PARTS="write lag nbd repair" SIZE_MB=1024 RTTS="50 100" RATE=1000 IPERF_SECS=8
#   LAG_SECS=60 LAG_MBIT=400 LAG_RTT=50 REPAIR_MB=1024
#   SKIP_BUILD=0 WORK=/tmp/locus-repl PREFIX=lrp- OUT=bench/results/replication.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MB=${SIZE_MB:-1024}
RTTS=${RTTS:-"50 100"}
RATE=${RATE:-1000}
IPERF_SECS=${IPERF_SECS:-8}
SKIP_BUILD=${SKIP_BUILD:-0}
WORK=${WORK:-/tmp/locus-repl}
PREFIX=${PREFIX:-lrp-}
OUT=${OUT:-$ROOT/bench/results/replication.md}
PARTS=${PARTS:-"write lag nbd repair"}
LAG_SECS=${LAG_SECS:-60}
LAG_MBIT=${LAG_MBIT:-400}
LAG_RTT=${LAG_RTT:-50}
REPAIR_MB=${REPAIR_MB:-1024}

NSA=${PREFIX}s0
NSB=${PREFIX}s1
NSR=${PREFIX}s2
IPA=10.99.0.1
IPB=10.99.0.2
IPR=10.99.0.3
META=$IPA:7070
METRICS=$IPA:9101
BIN=$WORK/bin
LOG=$WORK/logs
MNT=$WORK/mnt-a
MNTR=$WORK/mnt-r
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
[[ $(id -u) == 0 ]] || die "needs root (network namespaces, FUSE)"
command -v iperf3 >/dev/null || die "needs iperf3 (apt-get install iperf3): the link ceiling every part reports"

if [[ $SKIP_BUILD != 1 ]]; then
    say "cargo build --release (locus, locus-wan)"
    (cd "$ROOT" && cargo build --release -p locus -p testkit --bin locus --bin locus-wan) || die "build failed"
fi

UP_PID="" META_PID="" NODEA_PID="" NODEB_PID="" MOUNT_PID="" IPERF_PID="" CTL="" MOUNTR_PID="" NBD_PID=""
NODER_PIDS=()
ALLOWED_CC=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$NBD_PID" 100
    stop_pid "$MOUNT_PID" 50
    stop_pid "$MOUNTR_PID" 50
    for m in "$MNT" "$MNTR"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true; done
    for p in "${NODER_PIDS[@]}"; do stop_pid "$p" 50; done
    for p in "$NODEB_PID" "$NODEA_PID" "$META_PID" "$IPERF_PID" "$UP_PID"; do stop_pid "$p" 50; done
    [[ -x $BIN/locus-wan ]] && "$BIN/locus-wan" down --prefix "$PREFIX" 2>/dev/null || true
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$ALLOWED_CC" 2>/dev/null || true
    rm -rf "$WORK"/node-* "$WORK/meta.db"* "$WORK/nbd-src.img" 2>/dev/null || true
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for m in "$MNT" "$MNTR"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true; done
rm -rf "$WORK"
mkdir -p "$BIN" "$LOG" "$MNT" "$MNTR" "$WORK/node-a" "$WORK/node-b"
cp "$ROOT/target/release/locus" "$ROOT/target/release/locus-wan" "$BIN/"
LOCUS=$BIN/locus
WAN=$BIN/locus-wan
"$WAN" down --prefix "$PREFIX" 2>/dev/null || true
# Mutual TLS: a CA for this run and a certificate per process; admin commands (policy,
# status, fsck) use the admin certificate through LOCUS_CA/CERT/KEY (the admin role: fsck
# lists chunks on nodes, which a client certificate may not).
TLS_DIR=$WORK/tls
bench_pki "meta meta a" "node node-a a" "node node-b b" "node node-r0 r" "node node-r1 r" "node node-r2 r" \
    "client client-a a" "client client-r r" "client nbd-a a" "client nbd-b b" "admin admin a"

set_path() { # rtt_ms [rate_mbit]
    "$WAN" ctl --control "$CTL" set delay_ms="$(python3 -c "print($1/2)")" loss_pct=0 rate_mbit="${2:-$RATE}" \
        queue_bytes=auto >/dev/null
    sleep 0.3
}
wan_bytes() { # -> "a_to_b b_to_a"
    "$WAN" ctl --control "$CTL" stats | python3 -c '
import re, sys
t = sys.stdin.read()
ab = re.search(r"s0->s1 .*?released_bytes=(\d+)", t)
ba = re.search(r"s1->s0 .*?released_bytes=(\d+)", t)
print(ab.group(1) if ab else -1, ba.group(1) if ba else -1)'
}
metric() { # name -> value at node a
    ip netns exec "$NSA" python3 -c '
import sys, urllib.request
body = urllib.request.urlopen("http://'"$METRICS"'/metrics", timeout=5).read().decode()
for line in body.splitlines():
    if line.startswith(sys.argv[1] + "{"):
        print(line.rsplit(" ", 1)[1]); break
else:
    print(-1)' "$1"
}
now() { date +%s.%N; }
# MB/s iperf3 -P 8 (bbr) receives from A to B on the path as it is set now ("?" if it failed).
iperf_mbs() {
    local j=$WORK/iperf.json
    ip netns exec "$NSA" timeout $((IPERF_SECS + 30)) iperf3 -c "$IPB" -p 5201 -t "$IPERF_SECS" -O 2 -P 8 -C bbr -J \
        >"$j" 2>/dev/null || true
    python3 -c "import json; print(f'{json.load(open(\"$j\"))[\"end\"][\"sum_received\"][\"bits_per_second\"]/8e6:.1f}')" \
        2>/dev/null || echo "?"
}
secs() { python3 -c "print(f'{$2-$1:.3f}')"; }
mbs() { python3 -c "print(f'{$1/max($2,1e-9)/1e6:.1f}')"; }

sysctl -q -w net.ipv4.tcp_allowed_congestion_control="reno cubic bbr" || true
say "WAN emulator: 3 sites, $RATE Mbit/s"
"$WAN" up --prefix "$PREFIX" --sites 3 --rate-mbit "$RATE" >"$LOG/wan-up.out" 2>"$LOG/wan-fwd.err" &
UP_PID=$!
wait_line "$LOG/wan-up.out" "^ready" 30 "locus-wan up"
CTL=$(sed -n 's/^ready control=//p' "$LOG/wan-up.out")
set_path 0

ip netns exec "$NSA" "$LOCUS" meta --listen "$META" --db "$WORK/meta.db" --init --admit-node node-a --admit-node node-b \
    --admit-node node-r0 --admit-node node-r1 --admit-node node-r2 --no-root-squash a --no-root-squash b --no-root-squash r $(tls meta) >"$LOG/meta.out" 2>"$LOG/meta.err" &
META_PID=$!
wait_line "$LOG/meta.out" listening 30 "locus meta"
ip netns exec "$NSA" "$LOCUS" node --listen "$IPA:7101" --meta "$META" --data-dir "$WORK/node-a" --id node-a \
    --site a --metrics "$METRICS" --sync-timeout 60s $(tls node-a) >"$LOG/node-a.out" 2>"$LOG/node-a.err" &
NODEA_PID=$!
wait_line "$LOG/node-a.out" listening 30 "node a"
ip netns exec "$NSB" "$LOCUS" node --listen "$IPB:7102" --meta "$META" --data-dir "$WORK/node-b" --id node-b \
    --site b $(tls node-b) >"$LOG/node-b.out" 2>"$LOG/node-b.err" &
NODEB_PID=$!
wait_line "$LOG/node-b.out" listening 30 "node b"
nsenter --net="/run/netns/$NSA" "$LOCUS" mount "$MNT" --meta "$META" --site a $(tls client-a) >"$LOG/mount.out" 2>"$LOG/mount.err" &
MOUNT_PID=$!
wait_line "$LOG/mount.out" mounted 60 "locus mount"
sleep 3 # nodes learn each other at their heartbeat
ip netns exec "$NSB" iperf3 -s -p 5201 >"$LOG/iperf3.log" 2>&1 &
IPERF_PID=$!

mkdir "$MNT/single" "$MNT/sync" "$MNT/async"
pol() { ip netns exec "$NSA" "$LOCUS" policy set "$@" --meta "$META" >>"$LOG/policy.out" 2>&1; }
pol /sync --sites a,b --copies 1 --mode sync
pol /async --sites a,b --copies 1 --mode async --rpo 30s

# The sections of parts not run this time are kept from the file as it was (so one part
# can be re-measured without losing the others' tables), marked as kept.
PREVIOUS=$WORK/previous.md
if [[ -f $OUT ]]; then cp "$OUT" "$PREVIOUS"; else : >"$PREVIOUS"; fi
kept() { # part -> that part's section of the previous file (empty if none)
    python3 - "$1" "$PREVIOUS" <<'PY'
import re, sys
text = open(sys.argv[2]).read()
head = re.search(r"^Release build of .*?(?=\n\n)", text, re.S | re.M)
starts = {"write": text.find("Two sites joined"), "lag": text.find("## Lag under"), "nbd": text.find("## A block device"),
          "repair": text.find("## Repair after")}
start = starts[sys.argv[1]]
if start < 0:
    sys.exit()
ends = [i for i in list(starts.values()) + [text.find("\n## ", start + 1) + 1] if i > start]
section = text[start:min(ends, default=len(text))].rstrip()
print(section)
if "(Kept as" in section:
    sys.exit()
print()
print("(Kept as the previous run wrote it: " + " ".join(head.group(0).split()) + ")" if head else "(Kept from the previous run.)")
PY
}
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
write_out() { # the sections of the parts run so far, so a failing part keeps the others'
{
        echo "# Replication across sites (bench/replication.sh)"
        echo
        echo "Release build of $(cd "$ROOT" && git rev-parse --short HEAD) on $(nproc) cores, $(date -u +%Y-%m-%d);"
        echo "sites as network namespaces joined by locus-wan. Parts run: $PARTS."
        echo "Load average (1, 5, 15 min) at the start: $LOAD_START; at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "(other engineers' builds share the 2 cores: compare the figures of one run side by side)."
        if ! has_part write && [[ -n $(kept write) ]]; then
            echo
            kept write
        fi
        if ((${#ROWS[@]})); then
            echo
            echo "Two sites joined at $RATE Mbit/s per direction; meta, node a and the"
            echo "writing mount at A, node b at B. Writes: dd bs=1M conv=fsync of $SIZE_MB MiB of random"
            echo "data. single = the default policy (one node at A: one copy); sync / async = --sites a,b"
            echo "--copies 1. iperf3 = -P 8 with bbr on the same path, MB/s received."
            echo
            echo "| RTT ms | directory | MiB | seconds | MB/s | iperf3 -P 8 MB/s | WAN bytes A->B (async: until B holds every chunk) | load avg 1 min before | note |"
            echo "|---|---|---|---|---|---|---|---|---|"
            printf '%s\n' "${ROWS[@]}"
            echo
            echo "The goal: sync >= 80 % of min(single, link rate). Ratios of the rows above (link = $RATE Mbit/s):"
            echo
            echo "| RTT ms | sync / link | sync / iperf3 | sync / single | sync / min(single, link) | goal met |"
            echo "|---|---|---|---|---|---|"
            printf '%s\n' "${RATIOS[@]}"
            echo
            echo "A 4 KiB overwrite (dd conv=notrunc,fsync) in the middle of the sync file: bytes"
            echo "the forwarder carried (meta is at A, so only the node-to-node copy crosses)."
            echo
            echo "| RTT ms | A->B bytes | B->A bytes |"
            echo "|---|---|---|"
            printf '%s\n' "${OVER[@]}"
        fi
        if ! has_part lag && [[ -n $(kept lag) ]]; then
            echo
            kept lag
        fi
        if [[ -n $LAG_ROW ]]; then
            echo
            echo "## Lag under a sustained async write"
            echo
            echo "\`async\` a,b (--copies 1): 64 MiB files of random data, each fsynced, written at A"
            echo "paced at the link rate (the link set to the same rate); node a's"
            echo "locus_replication_lag_chunks and _oldest_seconds (whole seconds) sampled in a loop with a"
        echo "1 s sleep (each sample also takes two metric requests: see the sample count)."
            echo
            echo "| RTT ms | link and write Mbit/s | seconds written | MB/s written | samples | max lag chunks | max oldest s | RPO s | RPO breach log lines (whole run) | drained s after the writer |"
            echo "|---|---|---|---|---|---|---|---|---|---|"
            echo "$LAG_ROW"
        fi
        if ! has_part nbd && [[ -n $(kept nbd) ]]; then
            echo
            kept nbd
        fi
        if ((${#NBD_ROWS[@]})); then
            echo
            echo "## A block device written at B (issue 40)"
            echo
            echo "\`locus nbd\` (plain NBD on the site's loopback) serving a $SIZE_MB MiB export, written with"
            echo "nbdcopy --flush from a page-cached file of random bytes: at A in the single-site"
            echo "directory (meta, node a and the server at A: no WAN), and at B in the \`sync\` a,b"
            echo "directory (the server's meta is at A, its chunks go to node b and, synchronously,"
            echo "node a). iperf3 as above. The goal: at B >= 80 % of min(single-site, link)."
            echo
            echo "| RTT ms | single-site at A MB/s | sync a,b at B MB/s | iperf3 -P 8 MB/s | B / link | B / single | B / min(single, link) | goal met |"
            echo "|---|---|---|---|---|---|---|---|"
            printf '%s\n' "${NBD_ROWS[@]}"
        fi
        if ! has_part repair && [[ -n $(kept repair) ]]; then
            echo
            kept repair
        fi
        if [[ -n $REPAIR_ROW ]]; then
            echo
            echo "## Repair after a node of a three-node site is killed"
            echo
            echo "Site r: three nodes (default --repair-rate 64M, --repair-every 10s) and a mount;"
            echo "the file written with dd conv=fsync under the default policy (two copies at the"
            echo "site). node-r1 is killed -9; meta counts it gone after 10 s (NODE_GONE_SECS). Full redundancy ="
            echo "\`locus fsck\` finds every chunk at its copy count again (polled every second);"
            echo "repair time = from fsck first finding chunks short (meta counts the node gone) to"
        echo "that point, so it includes the wait for the next repair scan; bytes repaired = the"
        echo "repair workers' totals in \`locus status\`."
            echo
            echo "| MiB written | bytes on the killed node | bytes repaired | kill to short in fsck s | kill to full redundancy s | repair s | repair MB/s |"
            echo "|---|---|---|---|---|---|---|"
            echo "$REPAIR_ROW"
        fi
    } >"$OUT"
}
has_part() { [[ " $PARTS " == *" $1 "* ]]; }
ROWS=()
RATIOS=()
OVER=()
LAG_ROW="" REPAIR_ROW=""
NBD_ROWS=()
WRITE_RTTS=$RTTS
has_part write || WRITE_RTTS=""
for rtt in $WRITE_RTTS; do
    set_path "$rtt"
    say "RTT $rtt ms"
    iperf=$(iperf_mbs)
    declare -A RATE_OF=()
    for dir in single sync async; do
        f=$MNT/$dir/f-$rtt
        load=$(cut -d' ' -f1 /proc/loadavg)
        read -r w0 _ < <(wan_bytes)
        t0=$(now)
        head -c $((SIZE_MB << 20)) /dev/urandom | dd of="$f" bs=1M iflag=fullblock conv=fsync status=none
        t1=$(now)
        read -r w1 _ < <(wan_bytes)
        s=$(secs "$t0" "$t1")
        drained=""
        if [[ $dir == async ]]; then
            for _ in $(seq 3000); do
                [[ $(metric locus_replication_lag_chunks) == 0 ]] && break
                sleep 0.1
            done
            t2=$(now)
            read -r w1 _ < <(wan_bytes)
            drained="B holds every chunk $(secs "$t1" "$t2") s after fsync"
        fi
        say "  $dir: $(mbs $((SIZE_MB << 20)) "$s") MB/s, WAN A->B $((w1 - w0)) B $drained"
        RATE_OF[$dir]=$(mbs $((SIZE_MB << 20)) "$s")
        ROWS+=("| $rtt | $dir | $SIZE_MB | $s | ${RATE_OF[$dir]} | $iperf | $((w1 - w0)) | $load | $drained |")
    done
    RATIOS+=("$(python3 - "${RATE_OF[sync]}" "${RATE_OF[single]}" "$iperf" "$RATE" "$rtt" <<'PY'
import sys
sync, single, iperf, rate, rtt = sys.argv[1:]
sync, single, link = float(sync), float(single), float(rate) / 8
r = lambda a, b: f"{a / b:.2f}" if b else "?"
bound = min(single, link)
iperf_ratio = r(sync, float(iperf)) if iperf != "?" else "?"
print(f"| {rtt} | {r(sync, link)} | {iperf_ratio} | {r(sync, single)} | {r(sync, bound)} | {'yes' if sync >= 0.8 * bound else 'no'} |")
PY
)")
    # A 4 KiB overwrite in the middle of the sync file.
    read -r a0 b0 < <(wan_bytes)
    head -c 4096 /dev/urandom | dd of="$MNT/sync/f-$rtt" bs=4096 seek=$(((SIZE_MB << 20) / 2 / 4096)) \
        conv=notrunc,fsync status=none
    read -r a1 b1 < <(wan_bytes)
    OVER+=("| $rtt | $((a1 - a0)) | $((b1 - b0)) |")
    say "  4 KiB overwrite: A->B $((a1 - a0)) B, B->A $((b1 - b0)) B"
done
write_out

if has_part lag; then
    set_path "$LAG_RTT" "$LAG_MBIT"
    say "lag: async a,b, writing at $LAG_MBIT Mbit/s for $LAG_SECS s, RTT $LAG_RTT ms"
    samples=$WORK/lag.tsv
    : >"$samples"
    # The writer: 64 MiB files, each fsynced, paced so that the bytes written never run
    # ahead of LAG_MBIT since the start.
    python3 - "$MNT/async/lag" "$LAG_MBIT" "$LAG_SECS" >"$WORK/lag-writer.out" <<'PY' &
import os, sys, time
path, mbit, secs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rate = mbit * 1e6 / 8
os.makedirs(path, exist_ok=True)
start, done, n = time.monotonic(), 0, 0
while time.monotonic() - start < secs:
    with open(f"{path}/f{n}", "wb") as f:
        for _ in range(64):
            ahead = done / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
            f.write(os.urandom(1 << 20))
            done += 1 << 20
        f.flush()
        os.fsync(f.fileno())
    n += 1
print(done, time.monotonic() - start)
PY
    WRITER=$!
    while kill -0 "$WRITER" 2>/dev/null; do
        printf '%s\t%s\n' "$(metric locus_replication_lag_chunks)" "$(metric locus_replication_lag_oldest_seconds)" \
            >>"$samples"
        sleep 1
    done
    wait "$WRITER" || die "the lag writer failed"
    breach=$(grep -c "replication lag breaches the RPO" "$LOG/node-a.err" || true)
    read -r lag_bytes lag_secs <"$WORK/lag-writer.out"
    lag_secs=$(python3 -c "print(f'{$lag_secs:.1f}')")
    t1=$(now)
    for _ in $(seq 3000); do
        [[ $(metric locus_replication_lag_chunks) == 0 ]] && break
        sleep 0.1
    done
    drain=$(secs "$t1" "$(now)")
    read -r max_chunks max_age < <(python3 -c '
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
print(max(int(r[0]) for r in rows), max(int(r[1]) for r in rows))' "$samples")
    written=$(mbs "$lag_bytes" "$lag_secs")
    say "  wrote $written MB/s; max lag $max_chunks chunks, oldest $max_age s (RPO 30 s); drained $drain s after"
    LAG_ROW="| $LAG_RTT | $LAG_MBIT | $lag_secs | $written | $(wc -l <"$samples") | $max_chunks | $max_age | 30 | $breach | $drain |"
fi

write_out
if has_part nbd; then
    command -v nbdcopy >/dev/null || die "part nbd needs nbdcopy (libnbd-bin)"
    head -c $((SIZE_MB << 20)) /dev/urandom >"$WORK/nbd-src.img"
    mkdir -p "$MNT/single" "$MNT/sync"
    # Sets NBD_SECS to the seconds nbdcopy --flush takes to write the page-cached source
    # into export PATH served by `locus nbd` in namespace NS as certificate CERT of SITE.
    nbd_write() { # ns cert site path
        local t0 t1 out=$LOG/nbd-$2.out
        ip netns exec "$1" "$LOCUS" nbd --listen 127.0.0.1:10809 --plain --meta "$META" --site "$3" $(tls "$2") \
            --export "disk=$4,size=${SIZE_MB}M" >"$out" 2>>"$LOG/nbd-$2.err" &
        NBD_PID=$!
        wait_line "$out" "listening on" 60 "locus nbd at $3" "$NBD_PID"
        cat "$WORK/nbd-src.img" >/dev/null
        t0=$(now)
        ip netns exec "$1" nbdcopy --flush "$WORK/nbd-src.img" nbd://127.0.0.1:10809/disk || die "nbdcopy at $3 failed"
        t1=$(now)
        stop_pid "$NBD_PID" 300
        NBD_PID=""
        NBD_SECS=$(secs "$t0" "$t1")
    }
    for rtt in $RTTS; do
        set_path "$rtt"
        say "nbd: RTT $rtt ms"
        iperf=$(iperf_mbs)
        nbd_write "$NSA" nbd-a a "/single/nbd-$rtt.img"
        single=$(mbs $((SIZE_MB << 20)) "$NBD_SECS")
        nbd_write "$NSB" nbd-b b "/sync/nbd-$rtt.img"
        at_b=$(mbs $((SIZE_MB << 20)) "$NBD_SECS")
        say "  single-site at A $single MB/s, sync a,b at B $at_b MB/s (iperf3 $iperf MB/s)"
        NBD_ROWS+=("$(python3 - "$rtt" "$single" "$at_b" "$iperf" "$RATE" <<'PY'
import sys
rtt, single, at_b, iperf, rate = sys.argv[1:]
single, at_b, link = float(single), float(at_b), float(rate) / 8
bound = min(single, link)
print(f"| {rtt} | {single:.1f} | {at_b:.1f} | {iperf} | {at_b / link:.2f} | {at_b / single:.2f} | {at_b / bound:.2f} | "
      f"{'yes' if at_b >= 0.8 * bound else 'no'} |")
PY
)")
        rm -f "$MNT/single/nbd-$rtt.img" "$MNT/sync/nbd-$rtt.img"
    done
fi

write_out
if has_part repair; then
    set_path 0
    say "repair: site r with three nodes, $REPAIR_MB MiB under the default policy"
    for i in 0 1 2; do
        mkdir -p "$WORK/node-r$i"
        ip netns exec "$NSR" "$LOCUS" node --listen "$IPR:$((7110 + i))" --meta "$META" --data-dir "$WORK/node-r$i" \
            --id "node-r$i" --site r $(tls "node-r$i") >"$LOG/node-r$i.out" 2>"$LOG/node-r$i.err" &
        NODER_PIDS+=($!)
        wait_line "$LOG/node-r$i.out" listening 30 "node r$i"
    done
    nsenter --net="/run/netns/$NSR" "$LOCUS" mount "$MNTR" --meta "$META" --site r $(tls client-r) >"$LOG/mount-r.out" \
        2>"$LOG/mount-r.err" &
    MOUNTR_PID=$!
    wait_line "$LOG/mount-r.out" mounted 60 "locus mount at r"
    sleep 3
    mkdir "$MNTR/repair"
    head -c $((REPAIR_MB << 20)) /dev/urandom | dd of="$MNTR/repair/f" bs=1M iflag=fullblock conv=fsync status=none
    # fsck exits non-zero once the killed node is unreachable (a DAMAGE line): only its
    # under-replication lines count here.
    fsck_out() { ip netns exec "$NSA" "$LOCUS" fsck --meta "$META" 2>&1 || true; }
    fsck_clean() { fsck_out | grep -q "every chunk has the copies"; }
    for _ in $(seq 120); do fsck_clean && break; sleep 1; done
    fsck_clean || die "the written data never had its copies"
    repaired() { # bytes every repair worker reports in status
        ip netns exec "$NSA" "$LOCUS" status --meta "$META" 2>/dev/null | python3 -c '
import re, sys
print(sum(int(m) for m in re.findall(r"\((\d+) bytes\) repaired", sys.stdin.read())))'
    }
    r0=$(repaired)
    lost=$(du -sb "$WORK/node-r1" | cut -f1)
    kill -KILL "${NODER_PIDS[1]}"
    t0=$(now)
    for _ in $(seq 60); do fsck_clean || break; sleep 1; done
    fsck_clean && die "fsck never found the killed node's chunks short"
    detected=$(secs "$t0" "$(now)")
    for _ in $(seq 600); do
        fsck_clean && break
        sleep 1
    done
    t1=$(now)
    fsck_clean || die "repair did not restore every copy within 600 s"
    # The workers' totals reach status at their next heartbeat: wait until they settle.
    r1=$(repaired)
    for _ in $(seq 20); do
        sleep 2
        r2=$(repaired)
        [[ $r2 == "$r1" && $r2 != "$r0" ]] && break
        r1=$r2
    done
    bytes=$((r1 - r0))
    total=$(secs "$t0" "$t1")
    active=$(python3 -c "print(f'{$total-$detected:.3f}')")
    say "  killed node-r1 ($lost bytes); short in fsck after $detected s; full redundancy after $total s; $bytes bytes repaired in $active s"
    REPAIR_ROW="| $REPAIR_MB | $lost | $bytes | $detected | $total | $active | $(mbs "$bytes" "$active") |"
fi

write_out
say "wrote $OUT"
