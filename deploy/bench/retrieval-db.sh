#!/usr/bin/env bash
# Sourced by the retrieval and retention benchmarks: ensure_retrieval_db makes sure the seeded
# benchmark database of `make bench-retrieval` (1,000,000 memories in 10,000 spaces, with their
# embeddings and the HNSW index) exists, seeding it when it does not (a while) or when
# BENCH_REUSE is not 1. BENCH_SPACES seeds another size (spaces of 100 memories each) into a
# database of its own, engram_bench_retrieval_<spaces>, beside the default one. Needs $bin
# (release binaries) and $model_dir.

bench_spaces="${BENCH_SPACES:-10000}"
retrieval_db=engram_bench_retrieval
if [[ "$bench_spaces" != 10000 ]]; then
    retrieval_db="engram_bench_retrieval_$bench_spaces"
fi
retrieval_db_url="postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/$retrieval_db"

ensure_retrieval_db() {
    local seeded
    seeded="$(pg_psql postgres -c "SELECT 1 FROM pg_database WHERE datname = '$retrieval_db'")"
    if [[ -n "$seeded" ]]; then
        seeded="$(pg_psql "$retrieval_db" -c "SELECT 1 FROM pg_indexes WHERE indexname = 'memory_embeddings_hnsw'" || true)"
    fi
    if [[ "${BENCH_REUSE:-0}" != 1 || -z "$seeded" ]]; then
        log "creating a fresh $retrieval_db database (seeding takes a while: the HNSW index over 1M vectors)"
        pg_psql postgres -c "DROP DATABASE IF EXISTS $retrieval_db WITH (FORCE)" -c "CREATE DATABASE $retrieval_db TEMPLATE template1"
        ENGRAM_DATABASE__URL="$retrieval_db_url" "$bin/ingest" migrate
        "$bin/bench-retrieval" --database-url "$retrieval_db_url" --model-dir "$model_dir" seed --spaces "$bench_spaces"
    fi
    # A database seeded by an older build gets the migrations added since.
    ENGRAM_DATABASE__URL="$retrieval_db_url" "$bin/ingest" migrate
}
