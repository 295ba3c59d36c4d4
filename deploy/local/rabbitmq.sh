#!/usr/bin/env bash
# Local RabbitMQ for development and tests, without systemd.
# Reuses whatever already answers on 127.0.0.1:$ENGRAM_AMQP_PORT (guest/guest
# from localhost); otherwise installs Debian's rabbitmq-server and starts a
# loopback-only node whose config, data and logs live under $ENGRAM_LOCAL_DIR,
# so /etc/rabbitmq and any other node on the machine are left untouched.
#
# Usage: rabbitmq.sh up|down|status
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"

state_file="$ENGRAM_STATE_DIR/rabbitmq.state" # "started NODE" or "reused"
env_file="$ENGRAM_RABBIT_DIR/rabbitmq-env.conf"
rabbit_log_dir="$ENGRAM_LOG_DIR/rabbitmq"

# rmq TOOL ARGS...: Debian's wrappers in /usr/sbin switch to the rabbitmq
# user (so the Erlang cookie matches) and keep our environment, which
# points them at our rabbitmq-env.conf. Never call /usr/lib/rabbitmq/bin/*
# directly as root: cookie mismatch and root-owned files.
rmq() {
    local tool="$1"
    shift
    RABBITMQ_CONF_ENV_FILE="$env_file" "/usr/sbin/$tool" "$@"
}

ensure_installed() {
    [[ -x /usr/sbin/rabbitmq-server ]] && return 0
    log "installing rabbitmq-server (Debian package)"
    # Keep the package's maintainer scripts from starting a default node
    # (all interfaces, default config) where no policy says otherwise.
    local made_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local rc=0
    (apt_install rabbitmq-server) || rc=$?
    [[ "$made_policy" == 1 ]] && rm -f /usr/sbin/policy-rc.d
    [[ "$rc" == 0 ]] || die "could not install rabbitmq-server"
}

write_config() {
    install -d -m 755 "$ENGRAM_RABBIT_DIR"
    install -d -o rabbitmq -g rabbitmq -m 750 "$ENGRAM_RABBIT_DIR/mnesia"
    install -d -o rabbitmq -g rabbitmq -m 755 "$rabbit_log_dir"
    cat >"$ENGRAM_RABBIT_DIR/rabbitmq.conf" <<CONF
# Written by deploy/local/rabbitmq.sh. Loopback only.
listeners.tcp.default = 127.0.0.1:$ENGRAM_AMQP_PORT
CONF
    # The distribution port defaults to AMQP port + 20000 only when the AMQP
    # port comes from the environment; set it so a second node can coexist.
    cat >"$env_file" <<CONF
# Written by deploy/local/rabbitmq.sh; sourced by RabbitMQ's scripts.
NODENAME=$ENGRAM_RABBIT_NODE
CONFIG_FILE=$ENGRAM_RABBIT_DIR/rabbitmq.conf
MNESIA_BASE=$ENGRAM_RABBIT_DIR/mnesia
LOG_BASE=$rabbit_log_dir
ENABLED_PLUGINS_FILE=$ENGRAM_RABBIT_DIR/enabled_plugins
DIST_PORT=$((ENGRAM_AMQP_PORT + 20000))
ERL_EPMD_ADDRESS=127.0.0.1
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CONF
    # rabbitmq-plugins rewrites this file, so the rabbitmq user owns it.
    if [[ ! -f "$ENGRAM_RABBIT_DIR/enabled_plugins" ]]; then
        echo '[].' >"$ENGRAM_RABBIT_DIR/enabled_plugins"
        chown rabbitmq:rabbitmq "$ENGRAM_RABBIT_DIR/enabled_plugins"
    fi
}

start_node() {
    local startup_log="$rabbit_log_dir/startup.log"
    log "starting RabbitMQ node $ENGRAM_RABBIT_NODE on 127.0.0.1:$ENGRAM_AMQP_PORT (logs: $rabbit_log_dir)"
    # 9>&-: the node must not inherit our lock fd, or it holds it forever.
    rmq rabbitmq-server -detached >>"$startup_log" 2>&1 9>&- || true
    # await_startup exits 69 if the node is not registered yet: poll the
    # port first.
    if ! wait_for_port 127.0.0.1 "$ENGRAM_AMQP_PORT" 120; then
        tail -n 30 "$startup_log" "$rabbit_log_dir/$ENGRAM_RABBIT_NODE.log" >&2 2>/dev/null || true
        die "RabbitMQ did not open 127.0.0.1:$ENGRAM_AMQP_PORT within 120 s"
    fi
    local i
    for i in 1 2 3 4 5; do
        rmq rabbitmqctl -q -n "$ENGRAM_RABBIT_NODE" await_startup --timeout 60 >/dev/null 2>&1 && return 0
        sleep 2
    done
    die "rabbitmqctl await_startup failed for $ENGRAM_RABBIT_NODE"
}

our_node_answers() {
    [[ -f "$env_file" ]] && rmq rabbitmq-diagnostics -q -n "$ENGRAM_RABBIT_NODE" ping >/dev/null 2>&1
}

cmd_up() {
    ensure_local_dirs
    take_lock rabbitmq
    if port_open 127.0.0.1 "$ENGRAM_AMQP_PORT"; then
        if [[ "$(cat "$state_file" 2>/dev/null)" == "started $ENGRAM_RABBIT_NODE" ]] && our_node_answers; then
            log "RabbitMQ node $ENGRAM_RABBIT_NODE (started by these scripts) already answers on 127.0.0.1:$ENGRAM_AMQP_PORT; reusing it"
        else
            log "something already answers on 127.0.0.1:$ENGRAM_AMQP_PORT; reusing it (not started by these scripts, down will leave it alone)"
            echo "reused" >"$state_file"
        fi
        return 0
    fi
    is_root || die "need root to install/start RabbitMQ (or start one on 127.0.0.1:$ENGRAM_AMQP_PORT yourself)"
    ensure_installed
    write_config
    start_node
    echo "started $ENGRAM_RABBIT_NODE" >"$state_file"
    log "RabbitMQ ready: amqp://guest:guest@127.0.0.1:$ENGRAM_AMQP_PORT/%2f"
}

cmd_down() {
    local state
    state="$(cat "$state_file" 2>/dev/null || true)"
    if [[ "$state" != "started "* ]]; then
        log "RabbitMQ on 127.0.0.1:$ENGRAM_AMQP_PORT was not started by these scripts (or is already stopped); leaving it alone"
        return 0
    fi
    take_lock rabbitmq
    local node="${state#started }"
    log "stopping RabbitMQ node $node"
    # shutdown waits until the node's OS process has exited.
    if ! RABBITMQ_CONF_ENV_FILE="$env_file" /usr/sbin/rabbitmqctl -q -n "$node" shutdown >/dev/null 2>&1; then
        port_open 127.0.0.1 "$ENGRAM_AMQP_PORT" && die "rabbitmqctl shutdown failed for $node"
        log "node $node was not running"
    fi
    rm -f "$state_file"
}

cmd_status() {
    local state
    state="$(cat "$state_file" 2>/dev/null || echo "unknown")"
    if port_open 127.0.0.1 "$ENGRAM_AMQP_PORT"; then
        echo "rabbitmq: answering on 127.0.0.1:$ENGRAM_AMQP_PORT ($state)"
    else
        echo "rabbitmq: not running on 127.0.0.1:$ENGRAM_AMQP_PORT"
        return 3
    fi
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 up|down|status" >&2
        exit 2
        ;;
esac
