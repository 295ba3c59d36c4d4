#!/usr/bin/env bash
# make bench-ingest: seeds a fresh benchmark database (10,000 spaces x 200 entries, one space of
# 100,000), starts a release ingest service on it, drives Remember over gRPC, measures the
# near-duplicate lookup, and writes docs/benchmarks/ingest.md.
# BENCH_SECONDS, BENCH_CLIENTS override the load; BENCH_REUSE=1 keeps an existing seeded database;
# BENCH_HUGE_PAGES=0 measures Postgres on normal pages.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../local/common.sh
source "$here/../local/common.sh"

bin="${CARGO_TARGET_DIR:?}/release"
db=engram_bench
url="postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/$db"
port=50061

# Postgres runs as production should run it: its 6 GB buffer cache on 2 MB pages (the Postgres
# manual's advice for a large shared_buffers; worth about 8-12 % more writes/s here, see
# docs/benchmarks/README.md). That needs root (it sets vm.nr_hugepages) and a Postgres these scripts
# started (`restart` leaves any other alone); it is switched on by restarting Postgres, and off
# again at the end when the benchmark switched it on. Otherwise the run goes ahead on normal
# pages, and the report says which it had.
huge_pages_status() { pg_psql postgres -c "SHOW huge_pages_status"; }
huge_pages="$(huge_pages_status)"
switched_huge_pages=0
if [[ "${BENCH_HUGE_PAGES:-1}" == 1 && "$huge_pages" != on ]] && is_root; then
    log "restarting Postgres with its buffer cache on huge pages (services connected to it reconnect)"
    ENGRAM_PG_HUGE_PAGES=1 bash "$here/../local/postgres.sh" restart
    huge_pages="$(huge_pages_status)"
    [[ "$huge_pages" == on ]] && switched_huge_pages=1
fi
[[ "$huge_pages" == on ]] ||
    log "Postgres runs on normal pages for this benchmark (BENCH_HUGE_PAGES=0, or huge pages need root and the Postgres of make up)"

server=""
# On any exit: stop the benchmark's ingest service, then put Postgres back as it was.
clean_up() {
    if [[ -n "$server" ]]; then
        kill -TERM "$server" 2>/dev/null
        wait "$server" 2>/dev/null || true
    fi
    if (( switched_huge_pages )); then
        log "restarting Postgres on normal pages, as it was before the benchmark"
        ENGRAM_PG_HUGE_PAGES=0 bash "$here/../local/postgres.sh" restart
    fi
}
trap clean_up EXIT

exists="$(pg_psql postgres -c "SELECT 1 FROM pg_database WHERE datname = '$db'")"
if [[ "${BENCH_REUSE:-0}" != 1 || -z "$exists" ]]; then
    log "creating a fresh $db database"
    pg_psql postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db TEMPLATE template1"
    ENGRAM_DATABASE__URL="$url" "$bin/ingest" migrate
    "$bin/bench-ingest" --database-url "$url" seed
fi
# Every run starts with the benchmark's tables and indexes in the buffer cache, as a fresh seed
# leaves them (a reused database after a restart would otherwise start cold).
if pg_psql "$db" -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" >/dev/null 2>&1; then
    log "loading the database into the buffer cache"
    pg_psql "$db" -c "SELECT sum(pg_prewarm(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')" >/dev/null
fi
# Every run starts right after a checkpoint: the seed's gigabytes of WAL would otherwise trigger one
# at a point that varies from run to run, and the first write to each page after a checkpoint logs
# the whole page (the benchmark's largest source of run-to-run spread). This is the costly end of
# the checkpoint cycle, and the same for every run.
log "checkpoint before the run"
pg_psql "$db" -c "CHECKPOINT"

# The write path is measured alone: the embedding backfill (which would compete for the same two
# cores, and is measured by its own benchmark) is off.
log "starting a release ingest service on 127.0.0.1:$port (embedding backfill off)"
# shellcheck disable=SC2086  # BENCH_SERVER_ENV holds extra VAR=value words for the server
env ENGRAM_DATABASE__URL="$url" ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0 ENGRAM_DATABASE__MAX_CONNECTIONS=16 \
    ENGRAM_EMBED__PROVIDER=disabled RUST_LOG=warn ${BENCH_SERVER_ENV:-} "$bin/ingest" >"$ENGRAM_LOG_DIR/bench-ingest-server.log" 2>&1 &
server=$!
wait_for_port 127.0.0.1 "$port" 60 || die "the ingest service did not start (see $ENGRAM_LOG_DIR/bench-ingest-server.log)"

mkdir -p "$repo/docs/benchmarks"
"$bin/bench-ingest" --database-url "$url" run \
    --endpoint "http://127.0.0.1:$port" \
    --clients "${BENCH_CLIENTS:-16}" --seconds "${BENCH_SECONDS:-30}" \
    --report "$repo/docs/benchmarks/ingest.md" \
    --command-line "make bench-ingest"
