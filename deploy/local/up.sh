#!/usr/bin/env bash
# Start (or reuse) everything Engram needs locally, then write the
# environment the service and its tests read:
#   . /var/tmp/engram-local/env
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"

bash "$here/postgres.sh" up
bash "$here/rabbitmq.sh" up

env_out="$ENGRAM_LOCAL_DIR/env"
# Write to a temp file and rename so a reader never sees half a file.
cat >"$env_out.tmp" <<ENV
export ENGRAM_DATABASE__URL=$(bash "$here/postgres.sh" url)
export ENGRAM_AMQP__URL=amqp://guest:guest@127.0.0.1:$ENGRAM_AMQP_PORT/%2f
ENV
mv "$env_out.tmp" "$env_out"
log "wrote $env_out"
cat "$env_out"
