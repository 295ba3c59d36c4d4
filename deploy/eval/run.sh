#!/usr/bin/env bash
# make eval: a fresh evaluation database, a release ingest service (local embedder, backfill on,
# bus off: the sweeps embed and a local worker segments conversations) and a release retrieval
# service on it, then the two evaluation binaries: `eval` imports tests/eval/tasks.json over gRPC,
# waits for the embeddings, runs every configuration and writes docs/eval/retrieval.md;
# `eval-dialogs` loads tests/eval/dialogs as turns and as conversations and writes
# docs/eval/dialogs.md; `eval-facts` measures the facts consolidation writes on the labelled sets
# and the judged sample of the dev dialogs' facts (no services needed) and writes
# docs/eval/facts.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../local/common.sh
source "$here/../local/common.sh"

bin="${CARGO_TARGET_DIR:?}/release"
db=engram_eval
url="postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/$db"
ingest_port=50071
retrieval_port=50072
model_dir="$(bash "$here/../local/models.sh")"

log "creating a fresh $db database"
pg_psql postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db TEMPLATE template1"
ENGRAM_DATABASE__URL="$url" "$bin/ingest" migrate

common_env=(ENGRAM_DATABASE__URL="$url" ENGRAM_EMBED__PROVIDER=local ENGRAM_EMBED__MODEL_DIR="$model_dir" RUST_LOG=warn)
# Segments close by the rules and CloseSegment, never because the evaluation paused between
# sessions; eval-dialogs reads the same settings to know when segmentation is done.
segmentation_env=(ENGRAM_SEGMENTATION__IDLE_CLOSE_SECS=86400)
log "starting release ingest (127.0.0.1:$ingest_port) and retrieval (127.0.0.1:$retrieval_port) services"
env "${common_env[@]}" "${segmentation_env[@]}" ENGRAM_AMQP__ENABLED=false \
    ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$ingest_port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0 \
    "$bin/ingest" >"$ENGRAM_LOG_DIR/eval-ingest.log" 2>&1 &
ingest=$!
env "${common_env[@]}" ENGRAM_GRPC__LISTEN_ADDR="127.0.0.1:$retrieval_port" ENGRAM_GRPC__METRICS_LISTEN_ADDR=127.0.0.1:0 \
    "$bin/retrieval" >"$ENGRAM_LOG_DIR/eval-retrieval.log" 2>&1 &
retrieval=$!
trap 'kill -TERM $ingest $retrieval 2>/dev/null; wait $ingest $retrieval 2>/dev/null || true' EXIT
wait_for_port 127.0.0.1 "$ingest_port" 120 || die "the ingest service did not start (see $ENGRAM_LOG_DIR/eval-ingest.log)"
wait_for_port 127.0.0.1 "$retrieval_port" 120 || die "the retrieval service did not start (see $ENGRAM_LOG_DIR/eval-retrieval.log)"

mkdir -p "$repo/docs/eval"
if [[ "${1:-}" == "--reads-only" ]]; then
    # make eval-reads: only what an assistant reads from the dialogs, printed, no report written.
    # EVAL_DUMP_READS=<file> also writes every read (question, evidence, Markdown) as JSON lines.
    env "${segmentation_env[@]}" "$bin/eval-dialogs" --dialogs "$repo/tests/eval/dialogs" \
        --ingest "http://127.0.0.1:$ingest_port" --retrieval "http://127.0.0.1:$retrieval_port" \
        --database-url "$url" --report /dev/null --reads-only \
        ${EVAL_DUMP_READS:+--dump-reads "$EVAL_DUMP_READS"}
    exit 0
fi
"$bin/eval" --tasks "$repo/tests/eval/tasks.json" \
    --ingest "http://127.0.0.1:$ingest_port" --retrieval "http://127.0.0.1:$retrieval_port" \
    --report "$repo/docs/eval/retrieval.md" --command-line "make eval"
env "${segmentation_env[@]}" "$bin/eval-dialogs" --dialogs "$repo/tests/eval/dialogs" \
    --ingest "http://127.0.0.1:$ingest_port" --retrieval "http://127.0.0.1:$retrieval_port" \
    --database-url "$url" --report "$repo/docs/eval/dialogs.md" --command-line "make eval"
"$bin/eval-facts" --facts "$repo/tests/eval/facts/labelled.json" \
    --conflicts "$repo/tests/eval/conflicts/labelled.json" --dialogs "$repo/tests/eval/dialogs" \
    --dialog-facts "$repo/tests/eval/dialog_facts/labelled.json" \
    --report "$repo/docs/eval/facts.md" --command-line "make eval"
