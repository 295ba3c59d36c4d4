#!/usr/bin/env bash
# make bench-embed: a fresh database, a release ingest service with the local embedder, then the
# raw model throughput, the backfill draining a backlog, and write-to-embedding latency at a steady
# write rate, all in one run; writes docs/benchmarks/embed.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../local/common.sh
source "$here/../local/common.sh"

bin="${CARGO_TARGET_DIR:?}/release"
db=engram_bench_embed
url="postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/$db"
port=50062
model_dir="$(bash "$here/../local/models.sh")"
pg_psql postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db TEMPLATE template1"

log "starting a release ingest service with the local embedder on 127.0.0.1:$port"
env ENGRAM_DATABASE__URL="$url" ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0 ENGRAM_EMBED__PROVIDER=local \
    ENGRAM_EMBED__MODEL_DIR="$model_dir" RUST_LOG=warn "$bin/ingest" >"$ENGRAM_LOG_DIR/bench-embed-server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
wait_for_port 127.0.0.1 "$port" 120 || die "the ingest service did not start (see $ENGRAM_LOG_DIR/bench-embed-server.log)"

mkdir -p "$repo/docs/benchmarks"
"$bin/bench-embed" --database-url "$url" --model-dir "$model_dir" --endpoint "http://127.0.0.1:$port" \
    --report "$repo/docs/benchmarks/embed.md" --command-line "make bench-embed"
