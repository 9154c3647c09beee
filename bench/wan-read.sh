#!/usr/bin/env bash
# WAN read benchmark (issue 11, parts 1 and 5): one cold reader at site B of a file that lives
# at site A, beside `iperf3 -P 8 -C bbr` on the same emulated path, with the bottleneck's
# drop-tail queue sized in bandwidth-delay products. Sites are network namespaces joined by
# `locus-wan` (bench/lib.sh); nothing talks to an address outside them.
#
# Per point (RTT, queue): iperf3 MB/s, Locus MB/s and its ratio to iperf3, the packets the
# bottleneck tail-dropped (A->B) for each as a share of the packets it received, and the bytes
# that crossed A->B per byte read. Then a second file, as cold at B, read through the same B
# node right after: its connections to A carried the first read seconds before, as a site
# node's pool does in steady use (BBR keeps its window and bandwidth model across idle time;
# the node's server closes a connection only after 10 minutes without a request). Also a
# per-thread CPU table of the processes on the read path during the read at PROFILE_RTT ms
# with a 1 x BDP queue. Then (part 4) READERS clients
# at B (a mount process each) read the file at once, cold, at QUEUE_RTT ms with a 1 x BDP
# queue: their aggregate rate against the link, the bytes that crossed A->B per file, and a
# later reader at B (new mount, B's node keeps its site cache) against a cold reader at A.
#
# Usage (as root):  bench/wan-read.sh
#   SIZE_MB=1024  RTTS="10 50 100 200" (queue 1 x BDP)  QUEUE_RTT=100 QUEUES="0.5 2" (extra points)
#   RANDOM_READS=0 (N > 0: after each point's warm read, a new mount at B reads RANDOM_BYTES at the start of N distinct
#          4 MiB chunks of a third file, cold at B, at random, one at a time (bench/random_reads.py): the latency of a
#          read that must fetch its chunk across the WAN, and the bytes that crossed A->B per byte read)
#   RANDOM_BYTES=1048576 (4194304: whole chunks, which the kernel splits into requests that look sequential)
#   RANDOM_FADVISE=0 (1: the random reader calls posix_fadvise(POSIX_FADV_RANDOM): no kernel read-ahead)
#   ROUNDS=1 (more: every point again, round after round, and a table of the medians; a start-up
#          that costs a few round trips moves a 1 GiB read by a few %, as much as the path's own
#          run-to-run spread, so one round does not settle a ratio near a goal)
#   LOSS=0.5  RATE=1000 (Mbit/s)  READ_TIMEOUT=30 (s; a capped read reports its rate so far)
#   IPERF_SECS=8 IPERF_OMIT=2  PROFILE_RTT=100  READERS=8 (0: no many-readers point)  SKIP_BUILD=0
#   LOCUS_NODE_ARGS= LOCUS_MOUNT_ARGS=  OUT=bench/results/wan-read.md  WORK=/tmp/wan-read
#   LOCUS_BIN=target/release/locus (another build to compare, with SKIP_BUILD=1)
#   PERF=0 (1: also `perf record -a -g` the whole machine during the profiled cold read, and write
#          the hottest symbols per process to PROFILE_OUT's .perf.txt sibling; dwarf: record B's node
#          with DWARF call graphs instead, and write whose copies its memcpy samples are
#          (bench/perf_callers.py) to PROFILE_OUT's .node-b-copies.txt sibling)
#   SLOW_START_AFTER_IDLE= (0 or 1: net.ipv4.tcp_slow_start_after_idle in both sites' namespaces;
#          empty: the system's own, 1 on Linux; with 0 a connection that idled keeps its window)
#   TIMELINE=0 (1: bench/wan_timeline.py samples the bottleneck, A's connections to B and the CPU
#          of the processes on the path during every iperf3 run, TCP copy, cold and warm read,
#          into TIMELINE_OUT, one table per transfer; a row per TIMELINE_EVERY=1 s)
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
SIZE_MB=${SIZE_MB:-1024}
RTTS=${RTTS:-"10 50 100 200"}
ROUNDS=${ROUNDS:-1}
QUEUE_RTT=${QUEUE_RTT:-100}
QUEUES=${QUEUES:-"0.5 2"}
LOSS=${LOSS:-0.5}
RATE=${RATE:-1000}
READ_TIMEOUT=${READ_TIMEOUT:-30}
IPERF_SECS=${IPERF_SECS:-8}
IPERF_OMIT=${IPERF_OMIT:-2}
PROFILE_RTT=${PROFILE_RTT:-100}
PERF=${PERF:-0}
TIMELINE=${TIMELINE:-0}
TIMELINE_EVERY=${TIMELINE_EVERY:-1}
SLOW_START_AFTER_IDLE=${SLOW_START_AFTER_IDLE:-}
RA_KB=${RA_KB:-1024}
READERS=${READERS:-8}
RANDOM_READS=${RANDOM_READS:-0}
RANDOM_BYTES=${RANDOM_BYTES:-1048576}
RANDOM_FADVISE=${RANDOM_FADVISE:-0}
FADVISE_ARG=()
((RANDOM_FADVISE)) && FADVISE_ARG=(--fadvise-random)
LOCUS_NODE_ARGS=${LOCUS_NODE_ARGS:-}
LOCUS_MOUNT_ARGS=${LOCUS_MOUNT_ARGS:-}
SKIP_BUILD=${SKIP_BUILD:-0}
LOCUS_BIN=${LOCUS_BIN:-$ROOT/target/release/locus}
WORK=${WORK:-/tmp/wan-read}
PREFIX=${PREFIX:-lwr-}
OUT=${OUT:-$ROOT/bench/results/wan-read.md}
PROFILE_OUT=${PROFILE_OUT:-${OUT%.md}-profile.txt}
TIMELINE_OUT=${TIMELINE_OUT:-${OUT%.md}-timeline.md}

NSA=${PREFIX}s0 NSB=${PREFIX}s1 IPA=10.99.0.1 IPB=10.99.0.2
META=$IPA:7070
BYTES=$((SIZE_MB * 1048576))
BIN=$WORK/bin LOG=$WORK/logs
NODEA_DIR=$WORK/node-a NODEB_DIR=$WORK/node-b MNTA=$WORK/mnt-a MNTB=$WORK/mnt-b
TLS_DIR=$WORK/tls
ROWS=$WORK/rows.md
POINTS=$WORK/points.tsv
RANDOM_ROWS=$WORK/random.md

[[ $(id -u) == 0 ]] || die "needs root (network namespaces, FUSE, drop_caches)"
command -v iperf3 >/dev/null || die "needs iperf3 (apt-get install iperf3)"
if [[ $SKIP_BUILD != 1 ]]; then
    say "cargo build --release (locus, locus-wan)"
    (cd "$ROOT" && cargo build --release -p locus -p testkit --bin locus --bin locus-wan) || die "build failed"
fi

UP_PID="" META_PID="" NODEA_PID="" NODEB_PID="" MOUNTA_PID="" MOUNTB_PID="" IPERF_PID="" CTL="" TIMELINE_PID=""
EXTRA_PIDS=() EXTRA_MNTS=()
ALLOWED_CC=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    say "cleanup"
    [[ -n $TIMELINE_PID ]] && kill -TERM "$TIMELINE_PID" 2>/dev/null || true
    stop_extra_mounts
    stop_mount "$MOUNTB_PID" "$MNTB"
    stop_mount "$MOUNTA_PID" "$MNTA"
    for p in "$NODEB_PID" "$NODEA_PID" "$META_PID" "$IPERF_PID"; do stop_pid "$p" 50; done
    stop_pid "$UP_PID" 100
    [[ -x $BIN/locus-wan ]] && "$BIN/locus-wan" down --prefix "$PREFIX" 2>/dev/null || true
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$ALLOWED_CC" 2>/dev/null || true
    rm -rf "$NODEA_DIR" "$NODEB_DIR" "$WORK/meta.db"* 2>/dev/null || true
    exit $rc
}
stop_extra_mounts() {
    local i
    for i in "${!EXTRA_PIDS[@]}"; do stop_mount "${EXTRA_PIDS[$i]}" "${EXTRA_MNTS[$i]}"; done
    EXTRA_PIDS=() EXTRA_MNTS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for m in "$MNTB" "$MNTA"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true; done
rm -rf "$WORK"
mkdir -p "$BIN" "$LOG" "$NODEA_DIR" "$NODEB_DIR" "$MNTA" "$MNTB"
cp "$LOCUS_BIN" "$BIN/locus"
cp "$ROOT/target/release/locus-wan" "$BIN/"
BUILT=$(date -u -r "$LOCUS_BIN" '+%H:%M UTC')
LOCUS=$BIN/locus WAN=$BIN/locus-wan
"$WAN" down --prefix "$PREFIX" 2>/dev/null || true
bench_pki "meta meta a" "node node-a a" "node node-b b" "client client-a a" "client client-b b" "admin admin a"

sysctl -q -w net.ipv4.tcp_allowed_congestion_control="reno cubic bbr" || say "cannot widen tcp_allowed_congestion_control"
"$WAN" up --prefix "$PREFIX" --sites 2 --rate-mbit "$RATE" >"$LOG/wan-up.out" 2>"$LOG/wan-fwd.err" &
UP_PID=$!
wait_line "$LOG/wan-up.out" "^ready" 30 "locus-wan up" "$UP_PID"
CTL=$(sed -n 's/^ready control=//p' "$LOG/wan-up.out")
set_path 0 0
if [[ -n $SLOW_START_AFTER_IDLE ]]; then
    for ns in "$NSA" "$NSB"; do ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_slow_start_after_idle="$SLOW_START_AFTER_IDLE"; done
fi
SSAI_SHOWN=$(ip netns exec "$NSA" sysctl -n net.ipv4.tcp_slow_start_after_idle)

start_meta
start_node a
start_node b
start_mount a
say "writing $SIZE_MB MiB of random data at A"
head -c "$BYTES" /dev/urandom | dd of="$MNTA/big" bs=1M conv=fsync status=none
head -c "$BYTES" /dev/urandom | dd of="$MNTA/big2" bs=1M conv=fsync status=none
((RANDOM_READS > 0)) && head -c "$BYTES" /dev/urandom | dd of="$MNTA/big3" bs=1M conv=fsync status=none
stop_mount_site a
ip netns exec "$NSB" iperf3 -s -p 5201 >"$LOG/iperf3.log" 2>&1 &
IPERF_PID=$!
sleep 0.5

# MB/s (10^6 bytes/s, one decimal) of $1 bytes in $2 seconds.
mbs() { python3 -c "print(f'{$1 / max($2, 1e-9) / 1e6:.1f}')"; }
# MB/s of plain TCP moving the file's bytes A->B on 8 fresh BBR connections, from the first
# connect to the last byte received (bench/tcp_copy.py): the like-for-like yardstick of a
# cold read, start and ramp included ("0" if it failed).
tcp_copy_run() {
    local out=$WORK/tcp-copy.out t0 t1
    : >"$out"
    ip netns exec "$NSB" python3 "$ROOT/bench/tcp_copy.py" recv --listen "$IPB:5202" --bytes "$BYTES" --streams 8 >"$out" 2>>"$LOG/tcp-copy.err" &
    local rpid=$!
    wait_line "$out" "^listening" 10 "tcp_copy receiver" "$rpid"
    t0=$(timeout 120 ip netns exec "$NSA" python3 "$ROOT/bench/tcp_copy.py" send --to "$IPB:5202" --bytes "$BYTES" --streams 8 --cc bbr 2>>"$LOG/tcp-copy.err") || t0=""
    wait "$rpid" || true
    t1=$(tail -1 "$out")
    if [[ -z $t0 || $t1 == listening ]]; then echo 0; else mbs "$BYTES" "$(python3 -c "print($t1 - $t0)")"; fi
}
# "<A->B packets received> <A->B tail drops>" at the bottleneck so far.
counters() { echo "$(wan_counter received | cut -d' ' -f1) $(wan_counter queue_drops | cut -d' ' -f1)"; }
pct() { python3 -c "print(f'{100 * $2 / max($1, 1):.2f}')"; }
# With TIMELINE=1, what the transfer between timeline_start and timeline_stop did over time
# (bench/wan_timeline.py), appended to TIMELINE_OUT.
timeline_start() { # label
    [[ $TIMELINE == 1 ]] || return 0
    local wan_pid
    wan_pid=$(pgrep -P "$UP_PID" -f "locus-wan run" | head -1)
    python3 "$ROOT/bench/wan_timeline.py" --control "$CTL" --sender-ns "$NSA" --dst "$IPB" --label "$1" --every "$TIMELINE_EVERY" \
        --pids "node-a:$NODEA_PID,node-b:$NODEB_PID,mount-b:$MOUNTB_PID,emulator:${wan_pid:-0}" \
        >>"$TIMELINE_OUT" 2>>"$LOG/timeline.err" &
    TIMELINE_PID=$!
}
timeline_stop() {
    [[ -n $TIMELINE_PID ]] || return 0
    kill -TERM "$TIMELINE_PID" 2>/dev/null || true
    wait "$TIMELINE_PID" || true
    TIMELINE_PID=""
}

# Per-thread CPU of a process: "name ticks runqueue_wait_ns" per thread name (the wait, from
# schedstat, is time a thread was runnable while other processes held the cores).
thread_ticks() { # pid
    local t
    for t in /proc/"$1"/task/*; do
        awk -v w="$(cut -d' ' -f2 "$t/schedstat" 2>/dev/null || echo 0)" '{ match($0, /\(.*\)/);
            name = substr($0, RSTART + 1, RLENGTH - 2); split(substr($0, RSTART + RLENGTH + 1), f, " ");
            print name "\t" f[12] + f[13] "\t" w }' "$t/stat" 2>/dev/null || true
    done | awk -F'\t' '{ s[$1] += $2; w[$1] += $3 } END { for (n in s) printf "%s\t%d\t%.0f\n", n, s[n], w[n] }'
}
PROF_BEFORE=$WORK/prof-before
snap_profile() { # file
    local who pid
    : >"$1"
    for who in node-a:$NODEA_PID node-b:$NODEB_PID mount-b:$MOUNTB_PID; do
        pid=${who#*:}
        thread_ticks "$pid" | sed "s/^/${who%%:*}\t/" >>"$1"
    done
}

{
    echo "| round | RTT ms | queue (x BDP) | iperf3 -P 8 bbr MB/s | iperf3 tail drops % | TCP copy, 8 fresh flows MB/s | Locus MB/s | Locus / iperf3 | Locus / TCP copy | Locus tail drops % | WAN bytes / bytes read | read | Locus, warm node MB/s | warm / iperf3 | warm tail drops % | warm read |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"
} >"$ROWS"
if [[ $TIMELINE == 1 ]]; then
    printf '# WAN transfers over time (bench/wan-read.sh TIMELINE=1, bench/wan_timeline.py)\n\n%s, tree %s, link %s Mbit/s, loss %s %%, file %s MiB.\n\n' \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(git -C "$ROOT" rev-parse --short HEAD)" "$RATE" "$LOSS" "$SIZE_MB" >"$TIMELINE_OUT"
fi

point() { # rtt queue_factor
    local rtt=$1 qf=$2 q r0 d0 r1 d1 bps b s c w w0 w1 lr ld note ticks wr wd wnote
    q=$(python3 -c "print(max(int($RATE * 1e6 / 8 * $rtt / 1000 * $qf), 65536))")
    set_path "$rtt" "$LOSS" "$q"
    say "RTT $rtt ms, loss $LOSS %, queue $qf x BDP = $q B"
    read -r r0 d0 < <(counters)
    timeline_start "RTT $rtt ms, queue $qf x BDP: iperf3 -P 8 -C bbr"
    bps=$(iperf_run 8 bbr)
    timeline_stop
    read -r r1 d1 < <(counters)
    local ip_mbs ip_drop
    ip_drop=$(pct $((r1 - r0)) $((d1 - d0)))
    if [[ $bps == fail ]]; then ip_mbs=0; else ip_mbs=$(python3 -c "print(f'{$bps / 1e6:.1f}')"); fi
    local copy_mbs
    timeline_start "RTT $rtt ms, queue $qf x BDP: TCP copy, 8 fresh flows"
    copy_mbs=$(tcp_copy_run)
    timeline_stop
    cold_b
    read -r r0 d0 < <(counters)
    read -r w0 _ < <(wan_bytes)
    local perf_pid=""
    local profiled=0
    [[ $rtt == "$PROFILE_RTT" && $qf == 1 && $ROUND == 1 ]] && profiled=1
    if ((profiled)); then
        snap_profile "$PROF_BEFORE"
        if [[ $PERF == 1 ]]; then
            echo "node-a:$NODEA_PID node-b:$NODEB_PID mount-b:$MOUNTB_PID" >"$WORK/perf.pids"
            perf record -a -g -F 999 -o "$WORK/perf.data" 2>"$LOG/perf.err" &
            perf_pid=$!
        elif [[ $PERF == dwarf ]]; then
            perf record -p "$NODEB_PID" --call-graph dwarf,32768 -F 300 -o "$WORK/perf-dwarf.data" 2>"$LOG/perf.err" &
            perf_pid=$!
        fi
    fi
    timeline_start "RTT $rtt ms, queue $qf x BDP: Locus, cold read at B"
    read -r b s c < <(timed_dd "$MNTB/big" "$READ_TIMEOUT")
    timeline_stop
    if [[ -n $perf_pid ]]; then kill -INT "$perf_pid" && wait "$perf_pid" || true; fi
    ((profiled)) && { snap_profile "$WORK/prof-after"; PROF_SECS=$s; }
    read -r w1 _ < <(wan_bytes)
    read -r r1 d1 < <(counters)
    lr=$(mbs "$b" "$s")
    ld=$(pct $((r1 - r0)) $((d1 - d0)))
    note="complete"
    ((c == 1)) || note="capped at ${READ_TIMEOUT} s: $((b >> 20)) MiB"
    local wan_per_byte
    wan_per_byte=$(python3 -c "print(f'{($w1 - $w0) / max($b, 1):.3f}')")
    second_b
    read -r r0 d0 < <(counters)
    timeline_start "RTT $rtt ms, queue $qf x BDP: Locus, warm node at B"
    read -r b s c < <(timed_dd "$MNTB/big2" "$READ_TIMEOUT")
    timeline_stop
    read -r r1 d1 < <(counters)
    if ((RANDOM_READS > 0)); then
        second_b
        local rr rw0 rw1
        read -r rw0 _ < <(wan_bytes)
        timeline_start "RTT $rtt ms, queue $qf x BDP: Locus, random reads at B"
        rr=$(python3 "$ROOT/bench/random_reads.py" "$MNTB/big3" --count "$RANDOM_READS" --size "$RANDOM_BYTES" --seed "$ROUND" "${FADVISE_ARG[@]}")
        timeline_stop
        # Read-ahead started by the last read may still be crossing: let it land before counting.
        sleep 2
        read -r rw1 _ < <(wan_bytes)
        rr="$rr $(python3 -c "print(f'{($rw1 - $rw0) / ($RANDOM_READS * $RANDOM_BYTES):.2f}')")"
        say "  random reads at B (median, min, max ms; reads; A->B bytes per byte read): $rr"
        echo "$ROUND $rtt $qf $rr" >>"$RANDOM_ROWS"
    fi
    stop_mount_site b
    wr=$(mbs "$b" "$s")
    wd=$(pct $((r1 - r0)) $((d1 - d0)))
    wnote="complete"
    ((c == 1)) || wnote="capped at ${READ_TIMEOUT} s: $((b >> 20)) MiB"
    say "  iperf3 $ip_mbs MB/s (drops $ip_drop %), TCP copy $copy_mbs MB/s, Locus $lr MB/s (drops $ld %), $note; warm node $wr MB/s (drops $wd %), $wnote"
    echo "$rtt $qf $ip_mbs $copy_mbs $lr $wr" >>"$POINTS"
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$ROUND" "$rtt" "$qf" "$ip_mbs" "$ip_drop" "$copy_mbs" "$lr" \
        "$(python3 -c "print(f'{$lr / max($ip_mbs, 1e-9):.2f}')")" \
        "$(python3 -c "print(f'{$lr / max($copy_mbs, 1e-9):.2f}')")" "$ld" "$wan_per_byte" "$note" "$wr" \
        "$(python3 -c "print(f'{$wr / max($ip_mbs, 1e-9):.2f}')")" "$wd" "$wnote" >>"$ROWS"
}

# READERS clients at B read the file at once, cold (B's node restarted with an empty site
# cache, page cache dropped); then a later client at B, and a cold client at A for reference.
READER_ROWS=$WORK/readers.md
many_readers() {
    local n=$READERS rtt=$QUEUE_RTT q i w0 w1 b s c total=0 slowest=0 rates=() readers=() later single
    q=$(python3 -c "print(max(int($RATE * 1e6 / 8 * $rtt / 1000), 65536))")
    set_path "$rtt" "$LOSS" "$q"
    say "$n readers at B at once: RTT $rtt ms, loss $LOSS %, queue 1 x BDP = $q B"
    cold_b
    for ((i = 2; i <= n; i++)); do
        mkdir -p "$WORK/mnt-b$i"
        start_mount b "$WORK/mnt-b$i"
        EXTRA_PIDS+=("$EXTRA_MOUNT_PID") EXTRA_MNTS+=("$WORK/mnt-b$i")
    done
    drop_caches
    read -r w0 _ < <(wan_bytes)
    timed_dd "$MNTB/big" "$READ_TIMEOUT" >"$WORK/reader1" &
    readers+=($!)
    for ((i = 2; i <= n; i++)); do
        timed_dd "$WORK/mnt-b$i/big" "$READ_TIMEOUT" >"$WORK/reader$i" &
        readers+=($!)
    done
    wait "${readers[@]}"
    read -r w1 _ < <(wan_bytes)
    local complete=0
    for ((i = 1; i <= n; i++)); do
        read -r b s c <"$WORK/reader$i"
        total=$((total + b)) complete=$((complete + c))
        rates+=("$(mbs "$b" "$s")")
        slowest=$(python3 -c "print(max($slowest, $s))")
    done
    stop_extra_mounts
    read -r b s c < <(second_b && timed_dd "$MNTB/big" "$READ_TIMEOUT")
    later=$(mbs "$b" "$s")
    stop_mount_site b
    drop_caches
    start_mount a
    read -r b s c < <(timed_dd "$MNTA/big" "$READ_TIMEOUT")
    single=$(mbs "$b" "$s")
    stop_mount_site a
    local agg
    agg=$(mbs "$total" "$slowest")
    say "  aggregate $agg MB/s over $slowest s, WAN bytes $((w1 - w0)), later reader $later MB/s, single site $single MB/s"
    {
        echo "| readers | RTT ms | aggregate MB/s | aggregate / link | file / slowest time, / link | per reader MB/s (min-max) | WAN bytes / file | readers complete | later reader at B MB/s | cold reader at A MB/s | later at B / at A |"
        echo "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
        printf '| %s | %s | %s | %s | %s | %s | %s | %s/%s | %s | %s | %s |\n' "$n" "$rtt" "$agg" \
            "$(python3 -c "print(f'{$agg / ($RATE / 8):.2f}')")" \
            "$(python3 -c "print(f'{$BYTES / max($slowest, 1e-9) / 1e6 / ($RATE / 8):.2f}')")" \
            "$(printf '%s\n' "${rates[@]}" | sort -n | sed -n '1p;$p' | paste -sd-)" \
            "$(python3 -c "print(f'{($w1 - $w0) / $BYTES:.3f}')")" "$complete" "$n" "$later" "$single" \
            "$(python3 -c "print(f'{$later / max($single, 1e-9):.2f}')")"
    } >"$READER_ROWS"
}

PROF_SECS=0
for ROUND in $(seq 1 "$ROUNDS"); do
    for rtt in $RTTS; do point "$rtt" 1; done
    for qf in $QUEUES; do point "$QUEUE_RTT" "$qf"; done
done
((READERS > 0)) && many_readers

REV=$(cd "$ROOT" && git rev-parse --short HEAD)
DIRTY=$(cd "$ROOT" && git status --porcelain -- crates | wc -l)
{
    echo "# WAN read: one cold reader at B of a file at A, beside iperf3 (bench/wan-read.sh)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), tree $REV$([[ $DIRTY != 0 ]] && echo " + $DIRTY changed files in crates/") at the end, locus binary $LOCUS_BIN built $BUILT, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores."
    echo "Link $RATE Mbit/s per direction, random loss $LOSS %, drop-tail bottleneck queue in BDPs of the point's RTT;"
    echo "file $SIZE_MB MiB, one \`dd bs=64k\` at B (new mount, B's node restarted with an empty site cache, page cache dropped),"
    echo "capped at $READ_TIMEOUT s (a capped read reports its rate so far); iperf3 -P 8 -C bbr -t $IPERF_SECS -O $IPERF_OMIT A->B"
    echo "(its first $IPERF_OMIT s left out: the path's steady rate); TCP copy: bench/tcp_copy.py moving the file's bytes A->B"
    echo "on 8 fresh BBR connections, from the first connect to the last byte received (start and ramp included, as in a cold read)."
    echo "Tail drops: packets the bottleneck queue dropped A->B / packets it received A->B during the run."
    echo "Warm node: a second $SIZE_MB MiB file, never read at B, read right after by a new mount at B (page cache dropped)"
    echo "through the same B node, whose connections to A carried the first read seconds before (a site node in steady use)."
    echo "Node args: \`${LOCUS_NODE_ARGS:-(default)}\`, mount args: \`${LOCUS_MOUNT_ARGS:-(default)}\`, net.ipv4.tcp_slow_start_after_idle = $SSAI_SHOWN at both sites."
    echo
    cat "$ROWS"
    if ((ROUNDS > 1)); then
        echo
        echo "Medians over the $ROUNDS rounds (a ratio's median is of the per-round ratios, each measured side by side):"
        echo
        python3 - "$POINTS" <<'EOF'
import statistics, sys
points = {}
for line in open(sys.argv[1]):
    rtt, qf, ip, copy, cold, warm = line.split()
    points.setdefault((rtt, qf), []).append([float(v) for v in (ip, copy, cold, warm)])
print("| RTT ms | queue (x BDP) | rounds | iperf3 MB/s | TCP copy MB/s | Locus cold MB/s | Locus warm MB/s "
      "| cold / iperf3 | cold / TCP copy | warm / iperf3 | warm / iperf3 min-max |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for (rtt, qf), rows in points.items():
    med = lambda f: statistics.median(f(r) for r in rows)
    warm = sorted(r[3] / max(r[0], 1e-9) for r in rows)
    print(f"| {rtt} | {qf} | {len(rows)} | {med(lambda r: r[0]):.1f} | {med(lambda r: r[1]):.1f} | {med(lambda r: r[2]):.1f} "
          f"| {med(lambda r: r[3]):.1f} | {med(lambda r: r[2] / max(r[0], 1e-9)):.2f} | {med(lambda r: r[2] / max(r[1], 1e-9)):.2f} "
          f"| {statistics.median(warm):.2f} | {warm[0]:.2f}-{warm[-1]:.2f} |")
EOF
    fi
    if [[ -s $RANDOM_ROWS ]]; then
        echo
        echo "Random reads: after each point's warm read, a new mount at B (page cache dropped) reads $RANDOM_BYTES bytes at the start"
        echo "of $RANDOM_READS distinct 4 MiB chunks of a third $SIZE_MB MiB file, never read at B, in a random order (seeded by the round),"
        if ((RANDOM_FADVISE)); then echo "after posix_fadvise(POSIX_FADV_RANDOM) on the file (no kernel read-ahead),"; fi
        echo "one pread at a time (bench/random_reads.py): each read waits for its chunk to come from A over the warm"
        echo "connections of B's node. WAN / read: bytes that crossed A->B during the reads (and 2 s after, for read-ahead"
        echo "still in flight) per byte read."
        echo
        echo "| round | RTT ms | queue (x BDP) | reads | median ms | min ms | max ms | median / RTT | WAN / read |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        while read -r round rtt qf med lo hi n wan; do
            echo "| $round | $rtt | $qf | $n | $med | $lo | $hi | $(python3 -c "print(f'{$med / $rtt:.2f}')") | $wan |"
        done <"$RANDOM_ROWS"
    fi
    if [[ -s $READER_ROWS ]]; then
        echo
        echo "$READERS clients at B (a mount process each) read the file at once, cold, at $QUEUE_RTT ms, 1 x BDP queue;"
        echo "aggregate = bytes all read / the slowest reader's time; link = $RATE Mbit/s; file / slowest time: the rate at which"
        echo "the file itself reached B. Later reader: a new mount at B"
        echo "after them (page cache dropped, B's node keeps its site cache); cold reader at A: a new mount at A, page cache dropped."
        echo
        cat "$READER_ROWS"
    fi
} >"$OUT"
{
    echo "Per-thread CPU during the cold read at $PROFILE_RTT ms, 1 x BDP queue, $PROF_SECS s of reading"
    echo "(ticks of 1/$(getconf CLK_TCK) s from /proc/PID/task/*/stat, threads of one name summed; % of one core;"
    echo "runnable-waiting: time those threads were ready to run while other processes held the cores, from schedstat)."
    echo
    printf '%-8s %-20s %8s %7s %19s\n' process thread ticks "%core" "runnable-waiting %"
    python3 - "$PROF_BEFORE" "$WORK/prof-after" "$PROF_SECS" "$(getconf CLK_TCK)" <<'EOF'
import sys
def load(p):
    d = {}
    for line in open(p):
        proc, name, t, w = line.rstrip("\n").split("\t")
        old = d.get((proc, name), (0, 0))
        d[(proc, name)] = (old[0] + int(t), old[1] + int(w))
    return d
a, b, secs, hz = load(sys.argv[1]), load(sys.argv[2]), max(float(sys.argv[3]), 1e-9), int(sys.argv[4])
rows = sorted(((b[k][0] - a.get(k, (0, 0))[0], b[k][1] - a.get(k, (0, 0))[1], k) for k in b), reverse=True)
for t, w, (proc, name) in rows:
    if t > 0:
        print(f"{proc:<8} {name:<20} {t:>8} {100 * t / hz / secs:>6.1f} {100 * w / 1e9 / secs:>19.1f}")
EOF
} >"$PROFILE_OUT" 2>/dev/null || say "no profile (the profiled point did not run)"
if [[ $PERF == dwarf && -s $WORK/perf-dwarf.data ]]; then
    {
        echo "$(date -u '+%Y-%m-%d %H:%M UTC'), tree $(git -C "$ROOT" rev-parse --short HEAD), locus binary $LOCUS_BIN built $BUILT."
        echo "perf record -p <B's node> --call-graph dwarf -F 300 during the cold read at $PROFILE_RTT ms, 1 x BDP queue"
        echo "(bench/perf_callers.py: where its samples landed, and whose copies its memcpy/memmove samples are)."
        echo
        perf script -i "$WORK/perf-dwarf.data" -F ip,sym 2>/dev/null | python3 "$ROOT/bench/perf_callers.py"
    } >"${PROFILE_OUT%.txt}.node-b-copies.txt"
fi
if [[ $PERF == 1 && -s $WORK/perf.data ]]; then
    {
        echo "perf record -a -g -F 999 of the whole machine during the cold read at $PROFILE_RTT ms, 1 x BDP queue:"
        echo "share of all samples per process, then each Locus process's hottest functions (self time, % of its samples)."
        echo
        perf script -i "$WORK/perf.data" -F comm,pid,tid,ip,sym 2>/dev/null |
            python3 -c '
import collections, re, sys
names = {int(w.split(":")[1]): w.split(":")[0] for w in sys.argv[1].split()}
total, comm, top = collections.Counter(), {}, collections.defaultdict(collections.Counter)
pid, first = None, False
for line in sys.stdin:
    if line.strip() and not line.startswith("\t"):
        m = re.match(r"\s*(.*?)\s+(\d+)/(\d+)", line)
        pid, first = int(m.group(2)), True
        total[pid] += 1
        comm.setdefault(pid, m.group(1))
    elif line.startswith("\t") and first:
        parts = line.split(None, 1)
        top[pid][parts[1].strip() if len(parts) > 1 else parts[0]] += 1
        first = False
n = max(sum(total.values()), 1)
for p, c in total.most_common(8):
    who = names.get(p, comm[p] if p else "idle (swapper)")
    print(f"{100 * c / n:6.1f} %  {who} (pid {p})")
for p, who in names.items():
    print(f"\n## {who}: {100 * total[p] / n:.1f} % of all samples")
    for sym, c in top[p].most_common(20):
        print(f"{100 * c / max(total[p], 1):6.1f} %  {sym[:100]}")
' "$(cat "$WORK/perf.pids")"
    } >"${PROFILE_OUT%.txt}.perf.txt"
fi
cat "$OUT"
say "done in $(($(date +%s) - T_START)) s"
