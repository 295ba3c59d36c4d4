#!/usr/bin/env bash
# Drops databases left behind by interrupted test runs (tests drop their own when they finish).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

psql_admin() {
    "$ENGRAM_PG_BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$ENGRAM_PG_PORT" \
        -U "$ENGRAM_PG_SUPERUSER" -d postgres "$@"
}

leftovers="$(psql_admin -c "SELECT datname FROM pg_database WHERE datname LIKE 'engram\_test\_%'")"
for name in $leftovers; do
    psql_admin -c "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)"
done
[[ -z "$leftovers" ]] || log "dropped $(wc -w <<<"$leftovers") leftover test databases"
