# Shell pieces shared by the bench scripts that start their own clusters (sourced, not run).
# After sourcing: say/die log with the seconds since the source; bench_pki and tls need
# LOCUS and TLS_DIR set.

T_START=$(date +%s)

say() { printf '[%5ss] %s\n' "$(($(date +%s) - T_START))" "$*" >&2; }
die() {
    say "FAILED: $*"
    exit 1
}

# The directory of PostgreSQL's server binaries (initdb, pg_ctl), from PATH or Debian's layout.
pg_bin() {
    local initdb
    if initdb=$(command -v initdb); then dirname "$(readlink -f "$initdb")"; return; fi
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

# Mutual TLS for one run: a CA in TLS_DIR and a certificate per "role name site" argument;
# admin commands (policy, status, fsck) use the one named admin through LOCUS_CA/CERT/KEY.
bench_pki() {
    local c role name site
    "$LOCUS" ca init --dir "$TLS_DIR" >/dev/null
    for c in "$@"; do
        read -r role name site <<<"$c"
        "$LOCUS" ca issue --dir "$TLS_DIR" --role "$role" --name "$name" --site "$site" >/dev/null
    done
    export LOCUS_CA=$TLS_DIR/ca.pem LOCUS_CERT=$TLS_DIR/admin.pem LOCUS_KEY=$TLS_DIR/admin.key
}

# The TLS flags of the process whose certificate is named $1.
tls() { echo "--ca $TLS_DIR/ca.pem --cert $TLS_DIR/$1.pem --key $TLS_DIR/$1.key"; }

# Waits until file $1 has a line matching $2, for at most $3 seconds; else shows the
# process's last output and dies naming $4.
wait_line() {
    for _ in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    tail -20 "$1" "${1%.out}.err" >&2 2>/dev/null || true
    die "$4 not ready after $3 s"
}
