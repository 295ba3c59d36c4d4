#!/usr/bin/env bash
# make bench-review: a fresh database (migrated by the ingest binary), a release review service
# consuming SegmentClosed from the local RabbitMQ under a topology prefix of its own, with the
# local embedder and no LLM (the local grader, as `make run` has it); then the latency of a
# segment of 50 memories in process and the consumer's throughput through the bus; writes
# docs/benchmarks/review.md. BENCH_REPORT overrides the report's path.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../local/common.sh
source "$here/../local/common.sh"

bin="${CARGO_TARGET_DIR:?}/release"
db=engram_bench_review
url="postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/$db"
port=50064
model_dir="$(bash "$here/../local/models.sh")"
amqp_url="${ENGRAM_AMQP__URL:-amqp://guest:guest@127.0.0.1:$ENGRAM_AMQP_PORT/%2f}"
# Exchanges and queues of its own, so that nothing else on the broker sees the benchmark's events.
prefix="bench-review-$(date +%s)-$$"
report="${BENCH_REPORT:-$repo/docs/benchmarks/review.md}"

! port_open 127.0.0.1 "$port" || die "port $port is taken; stop what listens there"

log "creating a fresh $db database"
pg_psql postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db TEMPLATE template1"
ENGRAM_DATABASE__URL="$url" "$bin/ingest" migrate

review=""
clean_up() {
    if [ -n "$review" ]; then
        kill -TERM "$review" 2>/dev/null || true
        wait "$review" 2>/dev/null || true
    fi
    "$bin/bench-review" drop-topology --amqp-url "$amqp_url" --topology-prefix "$prefix" ||
        log "could not remove the exchanges and queues of $prefix from the broker"
}
trap clean_up EXIT

log "starting a release review service on 127.0.0.1:$port (bus prefix $prefix, local grader)"
env ENGRAM_DATABASE__URL="$url" ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0 \
    ENGRAM_AMQP__URL="$amqp_url" ENGRAM_AMQP__TOPOLOGY_PREFIX="$prefix" \
    ENGRAM_EMBED__PROVIDER=local ENGRAM_EMBED__MODEL_DIR="$model_dir" RUST_LOG=warn \
    "$bin/review" >"$ENGRAM_LOG_DIR/bench-review-server.log" 2>&1 &
review=$!
wait_for_port 127.0.0.1 "$port" 120 ||
    die "the review service did not start (see $ENGRAM_LOG_DIR/bench-review-server.log)"

mkdir -p "$(dirname "$report")"
"$bin/bench-review" run \
    --database-url "$url" --amqp-url "$amqp_url" --topology-prefix "$prefix" \
    --model-dir "$model_dir" --report "$report" --command-line "make bench-review"
