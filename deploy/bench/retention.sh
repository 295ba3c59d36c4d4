#!/usr/bin/env bash
# make bench-retention: copies the retrieval benchmark's database (seeding it first if needed,
# see retrieval-db.sh), makes 10 % of its memories due for deletion by age, starts a release
# retrieval service on the copy, and measures RetrieveMemory at 50 QPS before and while one
# retention run deletes them; writes docs/benchmarks/retention.md. BENCH_RATE, BENCH_SECONDS and
# BENCH_DUE_PERCENT override the load.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../local/common.sh
source "$here/../local/common.sh"

bin="${CARGO_TARGET_DIR:?}/release"
port=50064
model_dir="$(bash "$here/../local/models.sh")"
# shellcheck source=retrieval-db.sh
source "$here/retrieval-db.sh"
ensure_retrieval_db

# The run deletes rows: it works on a copy, so the retrieval benchmark's database stays as seeded.
db=engram_bench_retention
url="postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/$db"
log "copying $retrieval_db to $db"
pg_psql postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
    -c "CREATE DATABASE $db TEMPLATE $retrieval_db"

log "starting a release retrieval service on 127.0.0.1:$port"
# shellcheck disable=SC2086  # BENCH_SERVER_ENV holds extra VAR=value words for the server
env ENGRAM_DATABASE__URL="$url" ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0 ENGRAM_EMBED__PROVIDER=local RAYON_NUM_THREADS=1 \
    ENGRAM_EMBED__MODEL_DIR="$model_dir" RUST_LOG=warn ${BENCH_SERVER_ENV:-} \
    "$bin/retrieval" >"$ENGRAM_LOG_DIR/bench-retention-server.log" 2>&1 &
server=$!
cleanup() {
    kill -TERM "$server" 2>/dev/null
    wait "$server" 2>/dev/null || true
    pg_psql postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
}
trap cleanup EXIT
wait_for_port 127.0.0.1 "$port" 120 || die "the retrieval service did not start (see $ENGRAM_LOG_DIR/bench-retention-server.log)"

mkdir -p "$repo/docs/benchmarks"
"$bin/bench-retrieval" --database-url "$url" --model-dir "$model_dir" retention \
    --endpoint "http://127.0.0.1:$port" \
    --rate "${BENCH_RATE:-50}" --seconds "${BENCH_SECONDS:-30}" --due-percent "${BENCH_DUE_PERCENT:-10}" \
    --report "$repo/docs/benchmarks/retention.md" --command-line "make bench-retention"
