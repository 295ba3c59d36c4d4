#!/usr/bin/env bash
# Runs Engram's three services in the background for local use.
# Usage: services.sh start|stop|status
#   start  starts ingest (which applies migrations), then retrieval and review, each only if it is
#          not already serving; logs go to $ENGRAM_LOCAL_DIR/log/<service>.log
#   stop   sends SIGTERM to the services this script started and waits for a graceful stop
# ENGRAM_BIN_DIR names the directory holding the built binaries (the Makefile sets it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

ENGRAM_BIN_DIR="${ENGRAM_BIN_DIR:?set ENGRAM_BIN_DIR to the directory of the built binaries}"
SERVICES=(ingest:50051 retrieval:50052 review:50053)

pid_file() { echo "$ENGRAM_STATE_DIR/$1.pid"; }

running_pid() {
    local file pid
    file="$(pid_file "$1")"
    [[ -f "$file" ]] || return 1
    pid="$(cat "$file")"
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

start_one() {
    local name="$1" port="$2" pid
    if pid="$(running_pid "$name")" && port_open 127.0.0.1 "$port"; then
        log "$name already serving on 127.0.0.1:$port (pid $pid), reusing it"
        return 0
    fi
    if port_open 127.0.0.1 "$port"; then
        die "port $port is taken by something else; stop it or set ENGRAM_GRPC__LISTEN_ADDR"
    fi
    [[ -x "$ENGRAM_BIN_DIR/$name" ]] || die "$ENGRAM_BIN_DIR/$name is not built; run 'make build'"
    log "starting $name on 127.0.0.1:$port (log: $ENGRAM_LOG_DIR/$name.log)"
    # retrieval embeds small query batches: one model thread leaves the other core to Postgres
    # (docs/benchmarks/README.md). ingest's backfill keeps every core for its large batches.
    local extra_env=()
    if [[ "$name" == retrieval ]]; then
        extra_env+=("RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-1}")
    fi
    env "${extra_env[@]}" ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$port" \
        setsid nohup "$ENGRAM_BIN_DIR/$name" >>"$ENGRAM_LOG_DIR/$name.log" 2>&1 9>&- &
    echo $! >"$(pid_file "$name")"
    if ! wait_for_port 127.0.0.1 "$port" 150; then
        tail -n 20 "$ENGRAM_LOG_DIR/$name.log" >&2 || true
        die "$name did not start listening on $port"
    fi
}

stop_one() {
    local name="$1" pid i
    if ! pid="$(running_pid "$name")"; then
        rm -f "$(pid_file "$name")"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid"
    for ((i = 0; i < 150; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name did not stop within 30s; killing it"
        kill -KILL "$pid" || true
    fi
    rm -f "$(pid_file "$name")"
}

main() {
    ensure_local_dirs
    # The database and broker URLs written by up.sh.
    if [[ -f "$ENGRAM_LOCAL_DIR/env" ]]; then
        # shellcheck disable=SC1091
        source "$ENGRAM_LOCAL_DIR/env"
    fi
    case "${1:-}" in
        start)
            take_lock services
            for entry in "${SERVICES[@]}"; do start_one "${entry%%:*}" "${entry##*:}"; done
            ;;
        stop)
            take_lock services
            for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do stop_one "${SERVICES[i]%%:*}"; done
            ;;
        status)
            for entry in "${SERVICES[@]}"; do
                if pid="$(running_pid "${entry%%:*}")"; then
                    echo "${entry%%:*}: running (pid $pid) on 127.0.0.1:${entry##*:}"
                else
                    echo "${entry%%:*}: not running"
                fi
            done
            ;;
        *) die "usage: services.sh start|stop|status" ;;
    esac
}

main "$@"
