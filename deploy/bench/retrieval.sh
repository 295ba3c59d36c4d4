#!/usr/bin/env bash
# make bench-retrieval: seeds a benchmark database of 1,000,000 memories in 10,000 spaces (once;
# BENCH_REUSE=1 keeps a seeded one), starts a release retrieval service with the local embedder
# on it, measures RetrieveMemory, a hand-written SQL query and the floor in one run, and writes
# docs/benchmarks/retrieval.md. BENCH_SECONDS, BENCH_RATE, BENCH_CLIENTS override the load;
# BENCH_REPORT writes the report elsewhere; BENCH_SERVER_BIN measures another retrieval binary
# (an earlier build's, for a before/after on the same host and database); BENCH_SPACES measures
# another size (10,000 spaces of 100 memories by default; 30000 for 3M, in a database of its own).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../local/common.sh
source "$here/../local/common.sh"

bin="${CARGO_TARGET_DIR:?}/release"
port=50063
model_dir="$(bash "$here/../local/models.sh")"
# shellcheck source=retrieval-db.sh
source "$here/retrieval-db.sh"
ensure_retrieval_db
url="$retrieval_db_url"

# Every run starts with no cached scores, so that each retrieval rewrites the scores of every entry
# it returns, as the first retrieval of an hour does: what an earlier run left cached would
# otherwise decide how much the runs write, and runs would not compare.
log "clearing the cached scores an earlier run left"
pg_psql "$retrieval_db" \
    -c "UPDATE memory_retention SET last_scores = NULL, last_total = NULL, last_scored_at = NULL \
        WHERE last_scores IS NOT NULL OR last_total IS NOT NULL" \
    -c "UPDATE memories SET last_scores = NULL WHERE last_scores IS NOT NULL" \
    -c "VACUUM memories, memory_retention" >/dev/null

# Every run measures a service in its steady state: what the queries read is in memory. Without this,
# the first run after a seed (or a restart) finds the buffers full of what the seed wrote last and the
# p95 doubles. The tables and their indexes first go to the OS cache, then to Postgres' buffers as far
# as they fit; the HNSW index is left out (a space's hundred vectors are searched exactly through the
# scope index, as the service does, so the queries never read it). The tables' TOAST relations
# (and their indexes) are loaded too: the turn blocks keep their vectors there. The stored turns
# and their vectors go to the OS cache only: a retrieval reads closed turns from their blocks
# (the turns themselves only for open segments, which this data set has none of), and loaded
# into Postgres' buffers they would push out what the queries do read.
# Postgres' buffers are emptied first (where pg_buffercache can, Postgres 18): after a seed they
# hold what the seed wrote last, the HNSW index and the stored turns among it, which no query of
# the benchmark reads; prewarming only adds pages where there is room, so those stayed and a
# third of the turn blocks were read from the OS cache on every retrieval, as if after a restart
# that left the buffers full of someone else's pages.
if pg_psql "$retrieval_db" -c "CREATE EXTENSION IF NOT EXISTS pg_buffercache" >/dev/null 2>&1; then
    pg_psql "$retrieval_db" -c "SELECT pg_buffercache_evict_all()" >/dev/null 2>&1 \
        || log "could not empty Postgres' buffers (pg_buffercache_evict_all needs Postgres 18); prewarming over what they hold"
fi
if pg_psql "$retrieval_db" -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" >/dev/null 2>&1; then
    log "loading the benchmark's tables and indexes into memory"
    for mode in read buffer; do
        pg_psql "$retrieval_db" -c "WITH public_relations AS ( \
                SELECT c.oid, c.reltoastrelid FROM pg_class c \
                JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_am am ON am.oid = c.relam \
                WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i') AND am.amname IS DISTINCT FROM 'hnsw'), \
            toast AS ( \
                SELECT reltoastrelid AS oid FROM public_relations WHERE reltoastrelid <> 0 \
                UNION ALL \
                SELECT i.indexrelid FROM pg_index i JOIN public_relations r ON i.indrelid = r.reltoastrelid) \
            SELECT sum(pg_prewarm(o.oid, '$mode')) FROM (SELECT oid FROM public_relations UNION ALL SELECT oid FROM toast) o \
            WHERE '$mode' = 'read' OR NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indexrelid = o.oid \
                      AND i.indrelid IN ('conversation_turns'::regclass, 'conversation_turn_embeddings'::regclass)) \
                  AND o.oid NOT IN ('conversation_turns'::regclass, 'conversation_turn_embeddings'::regclass)" >/dev/null
    done
fi

log "starting a release retrieval service on 127.0.0.1:$port"
# shellcheck disable=SC2086  # BENCH_SERVER_ENV holds extra VAR=value words for the server
env ENGRAM_DATABASE__URL="$url" ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0 ENGRAM_EMBED__PROVIDER=local RAYON_NUM_THREADS=1 \
    ENGRAM_EMBED__MODEL_DIR="$model_dir" RUST_LOG=warn ${BENCH_SERVER_ENV:-} \
    "${BENCH_SERVER_BIN:-$bin/retrieval}" >"$ENGRAM_LOG_DIR/bench-retrieval-server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
wait_for_port 127.0.0.1 "$port" 120 || die "the retrieval service did not start (see $ENGRAM_LOG_DIR/bench-retrieval-server.log)"

mkdir -p "$repo/docs/benchmarks"
# The hand-written query and the floor embed in this process: their model runs on one thread, as
# the service's does, so every way pays the same for a model pass.
RAYON_NUM_THREADS=1 "$bin/bench-retrieval" --database-url "$url" --model-dir "$model_dir" run \
    --endpoint "http://127.0.0.1:$port" --spaces "$bench_spaces" \
    --rate "${BENCH_RATE:-50}" --seconds "${BENCH_SECONDS:-30}" --concurrency "${BENCH_CLIENTS:-32}" \
    --report "${BENCH_REPORT:-$repo/docs/benchmarks/retrieval.md}" --command-line "${BENCH_SPACES:+BENCH_SPACES=$BENCH_SPACES }make bench-retrieval" \
    --service-pid "$server"
