#!/usr/bin/env bash
# Drops databases left behind by interrupted test runs (tests drop their own when they finish).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"


leftovers="$(pg_psql postgres -c "SELECT datname FROM pg_database WHERE datname LIKE 'engram\_test\_%'")"
for name in $leftovers; do
    pg_psql postgres -c "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)"
done
[[ -z "$leftovers" ]] || log "dropped $(wc -w <<<"$leftovers") leftover test databases"
