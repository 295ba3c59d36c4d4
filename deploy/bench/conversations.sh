#!/usr/bin/env bash
# make bench-conversations: a fresh database, a release ingest service with the bus on (the local
# RabbitMQ, a topology prefix of its own) and the local embedder, as `make run` has them, and a
# release retrieval service; then AppendMessages at 200 turns/s from 16 clients, segmentation
# keeping up (or not), the time from a closing turn to its searchable episode, and a closed loop;
# writes docs/benchmarks/conversations.md.
# BENCH_RATE, BENCH_SECONDS, BENCH_CLIENTS override the load; BENCH_REPORT the report's path;
# BENCH_INGEST_BIN and BENCH_RETRIEVAL_BIN measure other builds (an earlier commit's, for a
# before/after on the same host): the database gets that ingest's migrations.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../local/common.sh
source "$here/../local/common.sh"

bin="${CARGO_TARGET_DIR:?}/release"
db=engram_bench_conversations
url="postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/$db"
ingest_port=50061
retrieval_port=50062
model_dir="$(bash "$here/../local/models.sh")"
amqp_url="${ENGRAM_AMQP__URL:-amqp://guest:guest@127.0.0.1:$ENGRAM_AMQP_PORT/%2f}"
# Exchanges and queues of their own, so that nothing else on the broker sees the benchmark's events.
prefix="bench-conversations-$(date +%s)-$$"
report="${BENCH_REPORT:-$repo/docs/benchmarks/conversations.md}"

for port in "$ingest_port" "$retrieval_port"; do
    ! port_open 127.0.0.1 "$port" || die "port $port is taken; stop what listens there"
done

log "creating a fresh $db database"
pg_psql postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db TEMPLATE template1"
ingest_bin="${BENCH_INGEST_BIN:-$bin/ingest}"
retrieval_bin="${BENCH_RETRIEVAL_BIN:-$bin/retrieval}"
ENGRAM_DATABASE__URL="$url" "$ingest_bin" migrate

ingest=""
retrieval=""
# On any exit: stop the services, then remove the run's exchanges and queues from the broker.
clean_up() {
    for pid in $retrieval $ingest; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    "$bin/bench-conversations" drop-topology --amqp-url "$amqp_url" --topology-prefix "$prefix" ||
        log "could not remove the exchanges and queues of $prefix from the broker"
}
trap clean_up EXIT

# What differs from the services' defaults: where they run and what they use, and the local
# embedder on. Every segmentation, memory, embedding and bus setting stays at its default.
ingest_env=(
    ENGRAM_DATABASE__URL="$url"
    ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$ingest_port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0
    ENGRAM_AMQP__URL="$amqp_url"
    ENGRAM_AMQP__TOPOLOGY_PREFIX="$prefix"
    ENGRAM_EMBED__PROVIDER=local
    ENGRAM_EMBED__MODEL_DIR="$model_dir"
)
log "starting a release ingest service on 127.0.0.1:$ingest_port (bus prefix $prefix, local embedder)"
# shellcheck disable=SC2086  # BENCH_SERVER_ENV holds extra VAR=value words for the ingest service
env "${ingest_env[@]}" RUST_LOG=warn ${BENCH_SERVER_ENV:-} \
    "$ingest_bin" >"$ENGRAM_LOG_DIR/bench-conversations-ingest.log" 2>&1 &
ingest=$!
# As `make run` starts it: one model thread for query embeddings. It only answers at the end.
log "starting a release retrieval service on 127.0.0.1:$retrieval_port"
env ENGRAM_DATABASE__URL="$url" ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$retrieval_port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0 \
    ENGRAM_EMBED__PROVIDER=local ENGRAM_EMBED__MODEL_DIR="$model_dir" RAYON_NUM_THREADS=1 RUST_LOG=warn \
    "$retrieval_bin" >"$ENGRAM_LOG_DIR/bench-conversations-retrieval.log" 2>&1 &
retrieval=$!
wait_for_port 127.0.0.1 "$ingest_port" 120 ||
    die "the ingest service did not start (see $ENGRAM_LOG_DIR/bench-conversations-ingest.log)"
wait_for_port 127.0.0.1 "$retrieval_port" 120 ||
    die "the retrieval service did not start (see $ENGRAM_LOG_DIR/bench-conversations-retrieval.log)"

mkdir -p "$(dirname "$report")"
"$bin/bench-conversations" run \
    --database-url "$url" \
    --endpoint "http://127.0.0.1:$ingest_port" \
    --retrieval-endpoint "http://127.0.0.1:$retrieval_port" \
    --amqp-url "$amqp_url" --topology-prefix "$prefix" \
    --ingest-pid "$ingest" --retrieval-pid "$retrieval" \
    --clients "${BENCH_CLIENTS:-16}" --rate "${BENCH_RATE:-200}" --seconds "${BENCH_SECONDS:-120}" \
    --service-settings "ENGRAM_EMBED__PROVIDER=local ENGRAM_EMBED__MODEL_DIR=<make models> ENGRAM_AMQP__TOPOLOGY_PREFIX=$prefix ENGRAM_GRPC__LISTEN_ADDR=127.0.0.1:$ingest_port ENGRAM_DATABASE__URL=<$db>${BENCH_SERVER_ENV:+ $BENCH_SERVER_ENV}" \
    --report "$report" \
    --command-line "make bench-conversations"
