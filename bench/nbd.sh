#!/usr/bin/env bash
# Locus files as NBD block devices (issue 40) against qemu-nbd serving a raw file on the
# same disk, side by side in one run, through clients nobody here wrote:
#   seq write   nbdcopy --flush of a SIZE_MB MiB file of random bytes (page-cached) to the export
#   seq read    nbdcopy of the export to null: (qemu-nbd after dropping the page cache;
#               `locus nbd` restarted first, so its chunk cache starts empty)
#   rand write  fio's nbd engine, 4 KiB random writes at queue depth 16 with a FLUSH
#               every 64 writes (fsync=64), RUNTIME seconds over the whole device
#   rand read   fio, 4 KiB random reads at queue depth 16, RUNTIME seconds
# Locus runs under `locus up` (SQLite meta and one node in one process, TLS between them);
# `locus nbd` is a process of its own, serving plain NBD on loopback as qemu-nbd does:
# with 4 MiB chunks (the default), with SMALL_CHUNK chunks (--chunk-size: a random read
# that misses the cache fetches one chunk), and over NBD's STARTTLS (sequential only).
# "stored / written" is what the random writes added to the chunk store over what fio
# wrote. Each round writes a fresh export and deletes it after (then `locus gc`), so the
# disk holds one device of each at a time.
#
# Usage (as root):  bench/nbd.sh
# Environment: SIZE_MB=4096 RUNTIME=20 ROUNDS=2 SMALL_CHUNK=256k SKIP_BUILD=0 WORK=/var/tmp/locus-nbd
#   OUT=bench/results/nbd.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MB=${SIZE_MB:-4096}
RUNTIME=${RUNTIME:-20}
SMALL_CHUNK=${SMALL_CHUNK:-256k}
ROUNDS=${ROUNDS:-2}
SKIP_BUILD=${SKIP_BUILD:-0}
WORK=${WORK:-/var/tmp/locus-nbd}
OUT=${OUT:-$ROOT/bench/results/nbd.md}
LOCUS=$ROOT/target/release/locus
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
[[ $(id -u) == 0 && -e /dev/fuse ]] || die "needs root and /dev/fuse (locus up mounts)"
for tool in nbdcopy qemu-nbd fio; do command -v $tool >/dev/null || die "needs $tool (qemu-utils, libnbd-bin, fio)"; done
fio --enghelp 2>/dev/null | grep -qw nbd || die "this fio has no nbd engine"

if [[ $SKIP_BUILD != 1 ]]; then
    say "cargo build --release (locus)"
    (cd "$ROOT" && cargo build --release -p locus --bin locus) || die "build failed"
fi

UP_PID="" NBD_PID="" QEMU_PID=""
cleanup() {
    [[ -n $NBD_PID ]] && stop_pid "$NBD_PID" 100
    [[ -n $QEMU_PID ]] && stop_pid "$QEMU_PID" 50
    [[ -n $UP_PID ]] && kill -INT "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
    umount -l "$WORK/mnt" 2>/dev/null || true
}
trap cleanup EXIT
start_up
"$LOCUS" ca issue --dir "$TLS_DIR" --role client --name nbd --site default --host 127.0.0.1 >/dev/null
"$LOCUS" ca issue --dir "$TLS_DIR" --role user --name nbd-user --site default >/dev/null
mkdir -p "$WORK/client-tls"
cp "$TLS_DIR/ca.pem" "$WORK/client-tls/ca-cert.pem"
cp "$TLS_DIR/nbd-user.pem" "$WORK/client-tls/client-cert.pem"
cp "$TLS_DIR/nbd-user.key" "$WORK/client-tls/client-key.pem"
NBD_TLS="--ca $TLS_DIR/ca.pem --cert $TLS_DIR/nbd.pem --key $TLS_DIR/nbd.key"

say "a $SIZE_MB MiB source of random bytes"
head -c $((SIZE_MB << 20)) /dev/urandom >"$WORK/src.img"
cat "$WORK/src.img" >/dev/null

# Serves the export `disk` = $1 (created at SIZE_MB when new) with `locus nbd`; plain
# unless $2 is tls, with SMALL_CHUNK chunks when it is small. Sets NBD_PID and URI.
start_locus() { # path plain|tls|small
    local port flags="--plain"
    port=$(free_port)
    [[ $2 == tls ]] && flags=""
    [[ $2 == small ]] && flags="--plain --chunk-size $SMALL_CHUNK"
    # shellcheck disable=SC2086
    "$LOCUS" nbd --listen "127.0.0.1:$port" --meta "$META" $NBD_TLS $flags \
        --export "disk=$1,size=${SIZE_MB}M" >"$WORK/nbd.out" 2>>"$WORK/nbd.err" &
    NBD_PID=$!
    wait_line "$WORK/nbd.out" "listening on" 60 "locus nbd" "$NBD_PID"
    if [[ $2 == tls ]]; then
        URI="nbds://127.0.0.1:$port/disk?tls-certificates=$WORK/client-tls"
    else
        URI="nbd://127.0.0.1:$port/disk"
    fi
}
stop_locus() { stop_pid "$NBD_PID" 300; NBD_PID=""; }
start_qemu() { # file
    local port
    port=$(free_port)
    qemu-nbd -f raw -t -e 8 -b 127.0.0.1 -p "$port" -x disk "$1" 2>>"$WORK/qemu.err" &
    QEMU_PID=$!
    for _ in $(seq 100); do nbdinfo "nbd://127.0.0.1:$port/disk" >/dev/null 2>&1 && break; sleep 0.1; done
    URI="nbd://127.0.0.1:$port/disk"
}
stop_qemu() { stop_pid "$QEMU_PID" 50; QEMU_PID=""; }

# Seconds an nbdcopy takes.
timed_copy() { # from to [flags]
    local t0
    t0=$(date +%s.%N)
    nbdcopy "${@:3}" "$1" "$2" || die "nbdcopy $1 $2 failed"
    python3 -c "print(f'{$(date +%s.%N) - $t0:.3f}')"
}

# fio over URI: prints "iops p50_us p99_us bytes" of the job's direction.
fio_run() { # randwrite|randread
    local dir=$1 extra=""
    [[ $dir == randwrite ]] && extra="--fsync=64"
    # shellcheck disable=SC2086
    fio --name=nbd --ioengine=nbd --uri="$URI" --rw="$dir" --bs=4k --iodepth=16 --time_based \
        --runtime="$RUNTIME" --size=${SIZE_MB}M $extra --output-format=json >"$WORK/fio.json" 2>>"$WORK/fio.err" ||
        die "fio $dir failed (see $WORK/fio.err)"
    python3 - "$WORK/fio.json" "$dir" <<'PYEOF'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]  # fio's nbd engine prints a line first
side = job["write" if sys.argv[2] == "randwrite" else "read"]
pct = side["clat_ns"]["percentile"]
print(f'{side["iops"]:.0f} {pct["50.000000"] / 1000:.0f} {pct["99.000000"] / 1000:.0f} {side["io_bytes"]}')
PYEOF
}

declare -A R
for r in $(seq 1 "$ROUNDS"); do
    # qemu-nbd over a raw file on the same disk.
    truncate -s "${SIZE_MB}M" "$WORK/qemu.img"
    start_qemu "$WORK/qemu.img"
    R[$r,qemu,write]=$(timed_copy "$WORK/src.img" "$URI" --flush)
    stop_qemu
    sync
    echo 3 >/proc/sys/vm/drop_caches
    cat "$WORK/src.img" >/dev/null
    start_qemu "$WORK/qemu.img"
    R[$r,qemu,read]=$(timed_copy "$URI" null:)
    R[$r,qemu,randwrite]=$(fio_run randwrite)
    R[$r,qemu,randread]=$(fio_run randread)
    stop_qemu
    rm -f "$WORK/qemu.img"
    say "round $r qemu-nbd: write ${R[$r,qemu,write]} s, read ${R[$r,qemu,read]} s, randwrite ${R[$r,qemu,randwrite]}, randread ${R[$r,qemu,randread]}"

    # locus nbd: plain, plain with small chunks, then TLS, each over a fresh file.
    for way in locus locus-small locus-tls; do
        mode=plain
        [[ $way == locus-tls ]] && mode=tls
        [[ $way == locus-small ]] && mode=small
        path=/r$r-$mode.img
        start_locus "$path" "$mode"
        R[$r,$way,write]=$(timed_copy "$WORK/src.img" "$URI" --flush)
        stop_locus
        sync
        echo 3 >/proc/sys/vm/drop_caches
        cat "$WORK/src.img" >/dev/null
        start_locus "$path" "$mode"
        R[$r,$way,read]=$(timed_copy "$URI" null:)
        # fio's nbd engine refuses the certificates in a URI: random I/O is plain only.
        R[$r,$way,randwrite]="- - - -" R[$r,$way,randread]="- - - -" R[$r,$way,stored]=-
        if [[ $mode != tls ]]; then
            before=$(du -sb "$WORK/data/chunks" | cut -f1)
            R[$r,$way,randwrite]=$(fio_run randwrite)
            sleep 1
            R[$r,$way,stored]=$(($(du -sb "$WORK/data/chunks" | cut -f1) - before))
            R[$r,$way,randread]=$(fio_run randread)
        fi
        stop_locus
        rm -f "$WORK/mnt$path"
        "$LOCUS" gc --meta "$META" --min-age 0s --force >/dev/null 2>&1 || say "gc after round $r failed (disk may fill)"
        say "round $r $way: write ${R[$r,$way,write]} s, read ${R[$r,$way,read]} s, randwrite ${R[$r,$way,randwrite]}, randread ${R[$r,$way,randread]}"
    done
done

mbps() { python3 -c "print(f'{$SIZE_MB * 1.048576 / $1:.0f}')"; }
{
    echo "# Locus files as NBD block devices against qemu-nbd (issue 40)"
    echo
    echo "bench/nbd.sh, release build of $(git -C "$ROOT" rev-parse --short HEAD), $(date -u +%Y-%m-%d), $(nproc) cores"
    echo "(shared machine; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)). qemu-nbd $(qemu-nbd --version | head -1 | awk '{print $2}')"
    echo "serves a raw file on the same disk (page cache, writeback); \`locus nbd\` serves a Locus file of \`locus up\` (SQLite"
    echo "meta, one node, TLS between them) plain on loopback with 4 MiB chunks, with $SMALL_CHUNK chunks (small), and over"
    echo "NBD's STARTTLS (tls; sequential only: fio's nbd engine refuses certificate files in a URI). $SIZE_MB MiB"
    echo "device. Sequential: nbdcopy --flush from a page-cached file, and to null: after dropping the page cache (and"
    echo "restarting \`locus nbd\`). Random: fio's nbd engine, 4 KiB, queue depth 16, ${RUNTIME} s, a FLUSH every 64 writes."
    echo
    echo "| round | server | seq write MB/s | seq read MB/s | rand write IOPS (p50 / p99 us) | rand read IOPS (p50 / p99 us) | stored / written |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for r in $(seq 1 "$ROUNDS"); do
        for way in qemu locus locus-small locus-tls; do
            read -r wi w50 w99 wbytes <<<"${R[$r,$way,randwrite]}"
            read -r ri r50 r99 _ <<<"${R[$r,$way,randread]}"
            stored=-
            [[ $way == locus || $way == locus-small ]] && stored=$(ratio "${R[$r,$way,stored]}" "$wbytes")
            echo "| $r | $way | $(mbps "${R[$r,$way,write]}") | $(mbps "${R[$r,$way,read]}") | $wi ($w50 / $w99) |" \
                "$ri ($r50 / $r99) | $stored |"
        done
    done
    echo
    echo "Locus / qemu-nbd in the same round (goals: sequential >= 0.80, random >= 0.50):"
    echo
    echo "| round | server | seq write | seq read | rand write | rand read |"
    echo "|---|---|---:|---:|---:|---:|"
    for r in $(seq 1 "$ROUNDS"); do
        for way in locus locus-small locus-tls; do
            read -r qwi _ _ <<<"${R[$r,qemu,randwrite]}"
            read -r qri _ _ <<<"${R[$r,qemu,randread]}"
            read -r wi _ _ <<<"${R[$r,$way,randwrite]}"
            read -r ri _ _ <<<"${R[$r,$way,randread]}"
            rw=- rr=-
            [[ $wi != - ]] && rw=$(ratio "$wi" "$qwi") && rr=$(ratio "$ri" "$qri")
            echo "| $r | $way | $(ratio "${R[$r,qemu,write]}" "${R[$r,$way,write]}") |" \
                "$(ratio "${R[$r,qemu,read]}" "${R[$r,$way,read]}") | $rw | $rr |"
        done
    done
} >"$OUT"
cat "$OUT"
