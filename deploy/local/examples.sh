#!/usr/bin/env bash
# Prints how to talk to the running services with grpcurl: the examples of README.md ("Talking to
# it with grpcurl"), which run in order as written (tests/tests/api/readme.rs runs them), so that
# what `make run` prints and what the README says are one text.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

# The shell blocks of the README's grpcurl section.
readme_examples() {
    awk '
        /^## / { in_section = ($0 == "## Talking to it with grpcurl") }
        in_section && /^```/ {
            if (in_block) print ""
            in_block = !in_block && ($0 == "```sh")
            next
        }
        in_section && in_block { print ($0 == "" ? "" : "  " $0) }
    ' "$here/../../README.md"
}

cat <<TEXT

Engram is running:
  ingest     127.0.0.1:50051   (logs: $ENGRAM_LOG_DIR/ingest.log)
  retrieval  127.0.0.1:50052   (logs: $ENGRAM_LOG_DIR/retrieval.log)
  review     127.0.0.1:50053   (logs: $ENGRAM_LOG_DIR/review.log)
  postgres   $(bash "$here/postgres.sh" url 2>/dev/null || echo "postgres://postgres@127.0.0.1:$ENGRAM_PG_PORT/engram")

Try it (grpcurl is in $ENGRAM_TOOLS_BIN), from README.md: paste these into one shell, in order.
TEXT
readme_examples
cat <<TEXT
Stop with 'make stop' (services) or 'make down' (everything).
TEXT
