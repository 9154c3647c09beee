#!/usr/bin/env bash
# Two sites on one machine: the walkthrough of README.md, "Metadata homes".
#
#   deploy/two-sites/walkthrough.sh up   [DIR]   build the grid (DIR: /tmp/locus-two-sites)
#   deploy/two-sites/walkthrough.sh demo [DIR]   a home at each site, writes, a move, a cut, a rejoin
#                                                (once per up)
#   deploy/two-sites/walkthrough.sh down [DIR]   stop everything and remove DIR (also after a failed up)
#   deploy/two-sites/walkthrough.sh all  [DIR]   up, demo, down
#
# What it builds: sites a and b, each a network namespace (l2s-a, l2s-b) joined through
# the project's WAN emulator (locus-wan, in l2s-wan) with a 50 ms round trip. Each site
# has its own PostgreSQL primary (a's holds home 0, the root's; b's holds home b) and a
# hot standby of the other site's server, a meta, a storage node and a FUSE mount
# (DIR/mnt-a, DIR/mnt-b); everything speaks mutual TLS with certificates of a CA in
# DIR/tls. Nothing listens outside the three namespaces, which reach nothing else.
#
# Needs: root, /dev/fuse, iproute2, ethtool, util-linux (nsenter, runuser), fuse3,
# Debian's postgresql package, and the release binaries:
#   cargo build --release -p locus -p testkit --bin locus --bin locus-wan
# Every command is printed ("+ ...") before it runs, with `locus` and `locus-wan` for
# $LOCUS and $LOCUS_WAN. Site processes run under `nsenter --net=/run/netns/SITE`
# (not `ip netns exec`, which would hide the FUSE mounts in a mount namespace of its own).
set -Eeuo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LOCUS=${LOCUS:-$ROOT/target/release/locus}
LOCUS_WAN=${LOCUS_WAN:-$ROOT/target/release/locus-wan}
MODE=${1:-}
DIR=${2:-/tmp/locus-two-sites}
A=10.98.0.1 B=10.98.0.2          # the sites' addresses (tests use 10.99.0.x)
DELAY_MS=25                      # one way: a 50 ms round trip
if command -v initdb >/dev/null; then
  PGBIN=$(dirname "$(readlink -f "$(command -v initdb)")")
else
  PGBIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)
fi

# --- helpers -----------------------------------------------------------------------
say() { printf '\n### %s\n' "$*"; }
show() {   # prints "+ command" with each word quoted as the shell needs it
  local w out=()
  for w in "$@"; do
    case $w in "$LOCUS") w=locus ;; "$LOCUS_WAN") w=locus-wan ;; esac
    if [[ $w == *[!A-Za-z0-9_./:=,@%+-]* ]]; then   # quoted: 'a b', or a\'b
      if [[ $w == *\'* ]]; then w=$(printf '%q' "$w"); else w="'$w'"; fi
    fi
    out+=("$w")
  done
  printf '+ %s\n' "${out[*]}" >&2
}
run() { show "$@"; "$@"; }
sh_run() { printf '+ %s\n' "$1" >&2; bash -c "$1"; }   # a command line with redirections
tails() { local f; for f in "$DIR"/logs/*.log; do if [[ -f $f ]]; then echo "--- $f:"; tail -n 8 "$f"; fi; done >&2; }
fail() { printf 'walkthrough: %s\n' "$*" >&2; tails; exit 1; }
at() { local site=$1; shift; run nsenter --net="/run/netns/l2s-$site" "$@"; }   # run in a site
wait_for() {   # wait_for WHAT SECONDS COMMAND...: polls every 0.2 s, fails after SECONDS
  local what=$1 secs=$2 deadline=$((SECONDS + $2)); shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out after $secs s waiting for $what"
    sleep 0.2
  done
}
start() {   # start NAME SITE CERT READY COMMAND...: in the background, logs in DIR/logs/NAME.log,
  # with the TLS flags of certificate CERT (- for none); waits for the line READY in its log
  local name=$1 ns=l2s-$2 cert=$3 ready=$4 log=$DIR/logs/$1.log; shift 4
  [[ $cert == - ]] || set -- "$@" --ca "$DIR/tls/ca.pem" --cert "$DIR/tls/$cert.pem" --key "$DIR/tls/$cert.key"
  show nsenter --net="/run/netns/$ns" "$@"; printf '    > %s 2>&1 &\n' "$log" >&2
  nsenter --net="/run/netns/$ns" "$@" >"$log" 2>&1 </dev/null &
  echo "$! $name" >>"$DIR/pids"
  local pid=$! deadline=$((SECONDS + 60))
  until grep -q "$ready" "$log"; do
    alive "$pid" || fail "$name exited (its log: $log)"
    ((SECONDS < deadline)) || fail "$name did not print '$ready' within 60 s (see $log)"
    sleep 0.2
  done
}
pg() { local site=$1 tool=$2; shift 2; at "$site" runuser -u postgres -- "$PGBIN/$tool" "$@"; }
pg_start() {   # pg_start SITE DIR PORT: the server of DIR/data on the site's address
  local ip=$A; [[ $1 == b ]] && ip=$B
  # fsync and full-page writes off: this is a demo, its data dies with it.
  pg "$1" pg_ctl start -w -t 60 -D "$2/data" -l "$2/server.log" -o "-c listen_addresses=$ip -p $3 -k $2 \
-c max_connections=400 -c shared_buffers=32MB -c max_prepared_transactions=64 -c fsync=off -c full_page_writes=off"
}
# ms_to FILE: milliseconds to create FILE (`: >FILE`, a create alone: `touch` would add a
# second write, setting its times), timed inside a bounded shell; ms3 FILE: three of them.
ms3() { local x y z; x=$(ms_to "$1.1") y=$(ms_to "$1.2") z=$(ms_to "$1.3"); echo "$x, $y, $z ms"; }
# shellcheck disable=SC2016  # expanded by that shell
ms_to() { timeout 30 bash -c 't=${EPOCHREALTIME//[!0-9]/}; : >"$1"; echo $(((${EPOCHREALTIME//[!0-9]/} - t) / 1000))' _ "$1"; }
# ms_mv FROM TO: milliseconds of `mv FROM TO` (printed first), which fails if mv does.
# shellcheck disable=SC2016  # expanded by that shell
ms_mv() { show mv "$1" "$2"; timeout 60 bash -c 't=${EPOCHREALTIME//[!0-9]/}; mv "$1" "$2" && echo $(((${EPOCHREALTIME//[!0-9]/} - t) / 1000))' _ "$1" "$2"; }
wan() { run "$LOCUS_WAN" ctl --control "$DIR/wan.ctl" "$@"; echo; }   # its answer has no newline
# The metas' databases: each site's primary (port 5432) and its standby of the other's (5433).
PA=postgres://locus@$A:5432 PA2=postgres://locus@$A:5433 PB=postgres://locus@$B:5432 PB2=postgres://locus@$B:5433
# Flags both metas take: every site's primary (for moves), timeouts as the tests use them
# (crates/locus/tests/homes.rs), and root trusted on both sites' mounts.
META_BOTH=(--site-db "a=$PA/locus" --site-db "b=$PB/home_b" --db-timeout 10s --primary-lease-ms 2000
  --no-root-squash a --no-root-squash b)
start_meta_b() {   # start_meta_b LOGNAME: b's meta reads home 0 at its standby, forwards its writes to a
  start "$1" b meta-b "locus meta listening on" "$LOCUS" meta --listen "$B:7070" --site b \
    --db "$PA/locus" --init --read-db "$PB2/locus" --forward-writes-to "$A:7070" \
    --home "b=$PB/home_b" --site-read-db "a=$PB2/locus" --site-meta "a=$A:7070" "${META_BOTH[@]}"
}
export LOCUS_CA=$DIR/tls/ca.pem LOCUS_CERT=$DIR/tls/admin.pem LOCUS_KEY=$DIR/tls/admin.key

# --- up: the network, PostgreSQL, certificates, metas, nodes, mounts -----------------
up() {
  [[ $(id -u) == 0 ]] || fail "run as root"
  for f in "$LOCUS" "$LOCUS_WAN" "$PGBIN/initdb" /dev/fuse; do [[ -e $f ]] || fail "$f is missing"; done
  compgen -G '/run/netns/l2s-*' >/dev/null && fail "namespaces l2s-* exist: run '$0 down $DIR' first"
  [[ -e $DIR ]] && fail "$DIR exists: run '$0 down $DIR' first"
  mkdir -p "$DIR/logs" && cd "$DIR"

  say "Network: sites l2s-a ($A) and l2s-b ($B), joined through locus-wan in l2s-wan"
  local i site
  for ns in l2s-wan l2s-a l2s-b; do
    run ip netns add "$ns"
    run ip netns exec "$ns" ip link set lo up
    # TCP buffers that may grow, no cached TCP metrics, no IPv6 chatter (as testkit's create_ns).
    run ip netns exec "$ns" sysctl -q -w "net.ipv4.tcp_rmem=4096 131072 67108864" \
      "net.ipv4.tcp_wmem=4096 16384 67108864" net.ipv4.tcp_no_metrics_save=1 \
      net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  done
  for i in 1 2; do   # site a is port s0, site b port s1
    site=l2s-$([[ $i == 1 ]] && echo a || echo b)
    run ip link add eth0 netns "$site" mtu 1500 type veth peer name "s$((i - 1))" netns l2s-wan mtu 1500
    run ip netns exec "$site" ip link set eth0 address "02:6c:77:00:00:0$i"
    run ip netns exec "$site" ip addr add "10.98.0.$i/24" dev eth0
    # Offloads off: every frame crosses the emulator whole, at most one MTU.
    run ip netns exec "$site" ethtool -K eth0 tx off rx off tso off gso off gro off >/dev/null
    run ip netns exec l2s-wan ethtool -K "s$((i - 1))" tx off rx off tso off gso off gro off >/dev/null
    run ip netns exec "$site" ip link set eth0 up
    run ip netns exec l2s-wan ip link set "s$((i - 1))" up
  done
  # Static neighbours: no ARP round trip through the delay before the first packet.
  run ip netns exec l2s-a ip neigh replace "$B" lladdr 02:6c:77:00:00:02 dev eth0 nud permanent
  run ip netns exec l2s-b ip neigh replace "$A" lladdr 02:6c:77:00:00:01 dev eth0 nud permanent
  start wan wan - ready "$LOCUS_WAN" run --port s0 --port s1 --control "$DIR/wan.ctl" --seed 1 \
    --max-frame 1518 --delay-ms "$DELAY_MS" --loss-pct 0 --rate-mbit 1000 --queue-bytes auto

  say "PostgreSQL: a primary at each site (home 0 at a, home b at b)"
  for site in a b; do
    run install -d -o postgres -g postgres "$DIR/pg-$site" "$DIR/pg-$site-standby"
    pg "$site" initdb -D "$DIR/pg-$site/data" -U locus -A trust -E UTF8 --locale=C -N >/dev/null
    sh_run "printf 'host all all 10.98.0.0/24 trust\nhost replication all 10.98.0.0/24 trust\n' >> $DIR/pg-$site/data/pg_hba.conf"
    pg_start "$site" "$DIR/pg-$site" 5432
  done
  pg a createdb -h "$A" -p 5432 -U locus locus
  pg b createdb -h "$B" -p 5432 -U locus home_b
  say "PostgreSQL: each site's hot standby of the other's server, on port 5433"
  pg b pg_basebackup -h "$A" -p 5432 -U locus -D "$DIR/pg-b-standby/data" -R -X stream -c fast
  pg_start b "$DIR/pg-b-standby" 5433
  pg a pg_basebackup -h "$B" -p 5432 -U locus -D "$DIR/pg-a-standby/data" -R -X stream -c fast
  pg_start a "$DIR/pg-a-standby" 5433

  say "Certificates: a CA, and one certificate per process"
  run "$LOCUS" ca init --dir "$DIR/tls"
  run "$LOCUS" ca issue --dir "$DIR/tls" --role meta --name meta-a --site a --host "$A"
  run "$LOCUS" ca issue --dir "$DIR/tls" --role meta --name meta-b --site b --host "$B"
  for n in a1:node:a b1:node:b client-a:client:a client-b:client:b admin:admin:a; do
    IFS=: read -r name role site <<<"$n"
    run "$LOCUS" ca issue --dir "$DIR/tls" --role "$role" --name "$name" --site "$site"
  done

  say "Metas: a holds home 0 and forwards home b's writes to b's meta; b the other way round"
  start meta-a a meta-a "locus meta listening on" "$LOCUS" meta --listen "$A:7070" --site a \
    --db "$PA/locus" --init --home "b=$PB/home_b" --read-db "b=$PA2/home_b" \
    --forward-writes-to "b=$B:7070" --site-read-db "b=$PA2/home_b" --site-meta "b=$B:7070" "${META_BOTH[@]}"
  start_meta_b meta-b

  say "A storage node and a mount at each site"
  # Admitted here, not with `meta --admit-node`: a meta starting across the WAN may find its
  # 2 s lease run out by then (a Locus bug), and a refused admission stops it.
  at a "$LOCUS" node admit a1 --meta "$A:7070"
  at a "$LOCUS" node admit b1 --meta "$A:7070"
  start node-a1 a a1 "locus node listening on" "$LOCUS" node --listen "$A:7101" --meta "$A:7070" \
    --data-dir "$DIR/a1" --id a1 --site a --capacity 10G --cache 1G
  start node-b1 b b1 "locus node listening on" "$LOCUS" node --listen "$B:7101" --meta "$B:7070" \
    --data-dir "$DIR/b1" --id b1 --site b --capacity 10G --cache 1G
  show nsenter --net=/run/netns/l2s-a "$LOCUS" status --meta "$A:7070"; echo "    (until both nodes are listed)" >&2
  wait_for "nodes a1 and b1 to register" 30 bash -c \
    "n=\$(nsenter --net=/run/netns/l2s-a $LOCUS status --meta $A:7070 | grep -c -e ' $A:7101' -e ' $B:7101'); ((n >= 2))"
  at a "$LOCUS" policy set / --copies 1 --meta "$A:7070"   # one copy, at the writer's site
  mkdir -p "$DIR/mnt-a" "$DIR/mnt-b"
  start mount-a a client-a "locus mounted on" "$LOCUS" mount "$DIR/mnt-a" --meta "$A:7070" --site a --cache 64M
  start mount-b b client-b "locus mounted on" "$LOCUS" mount "$DIR/mnt-b" --meta "$B:7070" --site b --cache 64M
  say "up: site a mounted at $DIR/mnt-a, site b at $DIR/mnt-b (logs in $DIR/logs)"
}

# --- demo: a home at each site, writes, a move, a cut, a rejoin ----------------------
demo() {
  [[ -d $DIR/mnt-a && -f $DIR/pids ]] || fail "no grid in $DIR: run '$0 up $DIR' first"
  cd "$DIR"
  local ma=$DIR/mnt-a mb=$DIR/mnt-b t0 took

  say "1. Home b: /b commits at site b's PostgreSQL primary"
  at b "$LOCUS" home create /b b --meta "$B:7070"
  at a "$LOCUS" home list --meta "$A:7070"

  say "2. Each site writes the home it holds; the other site reads it (through its standby)"
  sh_run "echo 'written at a' > $ma/from-a"
  sh_run "echo 'written at b' > $mb/b/from-b"
  show cat "$mb/from-a"; wait_for "from-a at site b" 30 grep -qx 'written at a' "$mb/from-a"
  show cat "$ma/b/from-b"; wait_for "from-b at site a" 30 grep -qx 'written at b' "$ma/b/from-b"
  echo "both files read back at the other site"
  # The first write a meta forwards opens its connection to the other meta: not timed.
  run timeout 30 touch "$ma/b/warm-a" "$mb/warm-b"
  local aa ab bb ba
  aa=$(ms3 "$ma/t-a") ab=$(ms3 "$ma/b/t-a") bb=$(ms3 "$mb/b/t-b") ba=$(ms3 "$mb/t-b")
  echo "three creates into the home held at the writer's site, three into the other's (a WAN round trip):"
  echo "  at site a: / (home 0) $aa;  /b (home b) $ab"
  echo "  at site b: /b (home b) $bb;  / (home 0) $ba"

  say "3. Move home b to site a (its writers are there, say)"
  at a "$LOCUS" home move b --to a --meta "$A:7070"
  at a "$LOCUS" home list --meta "$A:7070"
  [[ $(nsenter --net=/run/netns/l2s-a "$LOCUS" home list --meta "$A:7070" | grep ' b ') == *"written by site a"* ]] ||
    fail "home b is not written by site a after the move"
  show nsenter --net=/run/netns/l2s-b "$LOCUS" status --meta "$B:7070"; echo "    (its metadata homes section:)" >&2
  nsenter --net=/run/netns/l2s-b "$LOCUS" status --meta "$B:7070" | sed -n '/^metadata homes/,/^$/p' | tee "$DIR/status-b"
  grep -q 'moved from site b to site a' "$DIR/status-b" || fail "b's status does not show the move"

  say "4. The cut: 100 % loss between the sites"
  wan set loss_pct=100
  t0=$SECONDS
  sh_run "echo 'a, during the cut' > $ma/cut-a && echo 'a, during the cut' > $ma/b/cut-a" ||
    fail "site a could not write its homes during the cut"
  echo "site a wrote / and /b during the cut (both homes are held at a now)"
  took=$(date +%s%N)
  if sh_run "timeout -k 5 60 bash -c \"echo 'b, during the cut' > $mb/b/cut-b\""; then
    fail "a write at site b into home b (held at a, unreachable) succeeded during the cut"
  fi
  took=$((($(date +%s%N) - took) / 1000000))
  echo "site b's write into /b failed after $took ms, as it should: home b is held at a, unreachable"

  say "5. The rejoin: the link heals"
  wan set loss_pct=0
  printf '+ echo ... > %s   (until it succeeds)\n' "$mb/b/after-cut" >&2
  wait_for "site b writing /b again" 90 timeout -k 5 20 bash -c "echo 'b, after the cut' > $mb/b/after-cut"
  show cat "$mb/cut-a" "$mb/b/cut-a"
  wait_for "a's writes of the cut at b" 60 bash -c "grep -q cut $mb/cut-a && grep -q cut $mb/b/cut-a"
  echo "site b writes /b again and reads what a wrote during the cut ($((SECONDS - t0)) s since the cut)"
  at a "$LOCUS" fsck --meta "$A:7070" || fail "fsck is not clean after the rejoin"

  say "6. Home b back to site b"
  at b "$LOCUS" home move b --to b --meta "$B:7070"
  wait_for "both metas placing home b at b" 30 bash -c "
    [[ \$(nsenter --net=/run/netns/l2s-a $LOCUS home list --meta $A:7070 | grep ' b ') == *'written by site b'* ]] &&
    [[ \$(nsenter --net=/run/netns/l2s-b $LOCUS home list --meta $B:7070 | grep ' b ') == *'written by site b'* ]]"
  at b "$LOCUS" home list --meta "$B:7070"
  printf '+ touch %s %s   (until each succeeds)\n' "$mb/b/back-at-b" "$ma/b/back-at-a" >&2
  wait_for "site b writing /b" 60 timeout -k 5 20 touch "$mb/b/back-at-b"
  wait_for "site a writing /b" 60 timeout -k 5 20 touch "$ma/b/back-at-a"
  bb=$(ms3 "$mb/b/t-b-again") ab=$(ms3 "$ma/b/t-a-again")
  echo "three creates into /b: at site b $bb (local again); at site a $ab (forwarded to b)"

  say "7. Renames between the homes: atomic in both (two-phase commit across the two primaries)"
  local mv_b mv_a
  mv_b=$(ms_mv "$mb/b/from-b" "$mb/from-b") || fail "mv from /b to / at site b failed"
  mv_a=$(ms_mv "$ma/from-a" "$ma/b/from-a") || fail "mv from / to /b at site a failed"
  show cat "$mb/from-b" "$ma/b/from-a"
  if ! grep -qx 'written at b' "$mb/from-b" || ! grep -qx 'written at a' "$ma/b/from-a"; then
    fail "a renamed file reads wrong"
  fi
  wait_for "both renames at the other site" 30 bash -c "[[ -f $ma/from-b && -f $mb/b/from-a && ! -e $ma/b/from-b && ! -e $mb/from-a ]]"
  echo "/b/from-b -> /from-b at site b took $mv_b ms, /from-a -> /b/from-a at site a $mv_a ms (one rename(2) each, no copy)"
  at a "$LOCUS" fsck --meta "$A:7070" || fail "fsck is not clean after the renames"
  say "walkthrough done: home b made at b, written at both sites, moved to a, cut off and rejoined, moved back, renamed across; fsck clean"
}

# --- down: everything up started, in reverse; works after a partial up --------------
# A pid still running (not a zombie left for this shell to reap); one of ours: running locus.
alive() { [[ -e /proc/$1 ]] && ! grep -q '^State:.*Z' "/proc/$1/status"; } 2>/dev/null
ours() { alive "$1" && grep -q locus "/proc/$1/cmdline"; } 2>/dev/null
ours_left() {   # ours_left PREFIX: the recorded pids of ours whose name starts with PREFIX
  local pid name
  [[ -f $DIR/pids ]] || return 0
  while read -r pid name; do if [[ $name == "$1"* ]] && ours "$pid"; then echo "$pid"; fi; done <"$DIR/pids"
}
stop_ours() {   # stop_ours PREFIX: those processes, SIGTERM, 10 s for them to exit, SIGKILL
  local pid
  for pid in $(ours_left "$1"); do run kill "$pid" || true; done
  for _ in $(seq 50); do [[ -z $(ours_left "$1") ]] && break; sleep 0.2; done
  for pid in $(ours_left "$1"); do run kill -9 "$pid" || true; done
}
down() {
  cd /
  local m pid d ns
  # The mounts first: unmounted, each `locus mount` exits by itself (5 s at most).
  for m in "$DIR"/mnt-a "$DIR"/mnt-b; do
    grep -qs " $m fuse" /proc/self/mounts || continue
    run fusermount3 -u "$m" || run umount -l "$m" || true
  done
  for _ in $(seq 25); do [[ -z $(ours_left mount) ]] && break; sleep 0.2; done
  stop_ours mount
  stop_ours node
  stop_ours meta
  # PostgreSQL, the standbys first (a primary's shutdown waits for its standby to have
  # everything); then the WAN emulator.
  for d in "$DIR"/pg-{a,b}-standby/data "$DIR"/pg-{a,b}/data; do
    [[ -f $d/postmaster.pid ]] || continue
    run runuser -u postgres -- "$PGBIN/pg_ctl" stop -w -t 30 -m fast -D "$d" ||
      runuser -u postgres -- "$PGBIN/pg_ctl" stop -w -t 30 -m immediate -D "$d" || true
  done
  stop_ours wan
  for ns in l2s-a l2s-b l2s-wan; do
    [[ -e /run/netns/$ns ]] || continue
    # Anything left in the namespaces this script made (a failed start) goes with them.
    for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    run ip netns del "$ns" || true
  done
  run rm -rf "$DIR"
}

on_error() {
  local rc=$? line=$1
  echo "walkthrough: failed (exit $rc) at line $line: $BASH_COMMAND" >&2
  tails
}
trap 'on_error $LINENO' ERR

case $MODE in
  up) up ;;
  demo) demo ;;
  down) down ;;
  all) trap 'say down; down' EXIT; up; demo ;;
  *) echo "usage: $0 up|demo|down|all [DIR]  (DIR: /tmp/locus-two-sites)" >&2; exit 2 ;;
esac
