#!/usr/bin/env bash
# make report: what retrieval has been doing, from the retrieval_metrics table (one row per
# RetrieveMemory / ContextPreRetrieve request). REPORT_DB picks the database (default: the local
# one), REPORT_SINCE the window as a Postgres interval (default 7 days).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

db="${REPORT_DB:-$ENGRAM_PG_DB}"
since="${REPORT_SINCE:-7 days}"
[[ "$since" =~ ^[0-9a-z\ ]+$ ]] || die "REPORT_SINCE must be an interval like '7 days' or '12 hours'"
log "retrieval metrics of database $db over the last $since"

pg_psql_table() { "$ENGRAM_PG_BIN/psql" -X -h 127.0.0.1 -p "$ENGRAM_PG_PORT" -U "$ENGRAM_PG_SUPERUSER" -d "$db" -v ON_ERROR_STOP=1 -P pager=off "$@"; }

pg_psql_table <<SQL
\echo '== Overall'
SELECT count(*)                                                        AS requests,
       round(100.0 * avg((sparse_hits > 0)::int), 1)                   AS "sparse hit %",
       round(100.0 * avg((dense_hits > 0)::int), 1)                    AS "dense hit %",
       round(100.0 * avg((trigram_hits > 0)::int), 1)                  AS "trigram hit %",
       round(100.0 * avg((context_items > 0)::int), 1)                 AS "answered %",
       round(100.0 * avg(used_fallback::int), 1)                       AS "fallback %",
       round(100.0 * avg(truncated::int), 1)                           AS "truncated %",
       round(100.0 * avg((error_stage IS NOT NULL)::int), 1)           AS "error %",
       round(avg(context_items), 1)                                    AS "items avg",
       round(avg(estimated_tokens))                                    AS "tokens avg",
       round(percentile_cont(0.5)  WITHIN GROUP (ORDER BY latency_retrieval_ms)::numeric, 1) AS "p50 ms",
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_retrieval_ms)::numeric, 1) AS "p95 ms",
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_embed_ms)::numeric, 1)     AS "embed p95 ms"
FROM retrieval_metrics
WHERE created_at > now() - interval '$since';

\echo '== By path (which leg or fallback served the request)'
SELECT retrieval_path AS path, ranking_profile AS profile, count(*) AS requests,
       round(100.0 * count(*) / sum(count(*)) OVER (), 1)             AS "share %",
       round(avg(context_items), 1)                                    AS "items avg",
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_retrieval_ms)::numeric, 1) AS "p95 ms"
FROM retrieval_metrics
WHERE created_at > now() - interval '$since'
GROUP BY 1, 2
ORDER BY requests DESC;

\echo '== Errors by stage'
SELECT error_stage AS stage, count(*) AS requests
FROM retrieval_metrics
WHERE created_at > now() - interval '$since' AND error_stage IS NOT NULL
GROUP BY 1
ORDER BY 2 DESC;

\echo '== Per hour (last 24 hours)'
SELECT date_trunc('hour', created_at) AS hour, count(*) AS requests,
       round(100.0 * avg(used_fallback::int), 1)                       AS "fallback %",
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_retrieval_ms)::numeric, 1) AS "p95 ms"
FROM retrieval_metrics
WHERE created_at > now() - interval '24 hours'
GROUP BY 1
ORDER BY 1 DESC;
SQL
