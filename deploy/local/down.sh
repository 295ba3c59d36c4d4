#!/usr/bin/env bash
# Stop what up.sh started, in reverse order. Services that were already
# running before up.sh (and so were reused) are left alone.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

bash "$here/rabbitmq.sh" down
bash "$here/postgres.sh" down
