#!/usr/bin/env bash
# Prints how to talk to the running services with grpcurl.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

cat <<TEXT

Engram is running:
  ingest     127.0.0.1:50051   (logs: $ENGRAM_LOG_DIR/ingest.log)
  retrieval  127.0.0.1:50052   (logs: $ENGRAM_LOG_DIR/retrieval.log)
  review     127.0.0.1:50053   (logs: $ENGRAM_LOG_DIR/review.log)
  postgres   $(bash "$here/postgres.sh" url 2>/dev/null || echo "postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/engram")

Try it (grpcurl is in $ENGRAM_TOOLS_BIN):
  export PATH="$ENGRAM_TOOLS_BIN:\$PATH"
  grpcurl -plaintext 127.0.0.1:50051 list
  grpcurl -plaintext 127.0.0.1:50051 describe engram.v1.IngestService
  grpcurl -plaintext -d '{"scope":{"user_id":"6f1c1f4e-2f0b-4a4e-9a34-9d4f3f1e2a10","space":"work"},"text":"I prefer dark mode in every editor"}' \\
      127.0.0.1:50051 engram.v1.IngestService/Remember
  grpcurl -plaintext -d '{"scope":{"user_id":"6f1c1f4e-2f0b-4a4e-9a34-9d4f3f1e2a10","space":"work"},"query":"which editor theme?"}' \\
      127.0.0.1:50052 engram.v1.RetrievalService/RetrieveMemory
  grpcurl -plaintext -d '{"scope":{"user_id":"6f1c1f4e-2f0b-4a4e-9a34-9d4f3f1e2a10","space":"work"}}' \\
      127.0.0.1:50052 engram.v1.RetrievalService/ListEntries

More in README.md. Stop with 'make stop' (services) or 'make down' (everything).
TEXT
