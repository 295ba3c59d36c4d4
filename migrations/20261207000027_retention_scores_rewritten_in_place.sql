-- Retrieval's cached scores are rewritten in place (issue 41). Every retrieval that is the first
-- in its space for a while writes the scores of about 20 entries (the trace writer, batched), and
-- the total and time it writes were keys of three indexes kept for the soft cap. No such update
-- could be HOT: each wrote a new index entry in every index of the table, the primary key's among
-- them, at 60-75 µs a row under load, about a sixth of Postgres' statement time in
-- `make bench-retrieval`. Alone, 800 rows took 25-29 ms with those indexes and 14-17 ms without.
--
-- The soft cap now reads the space's rows through an index on the space alone, whose keys no
-- score write changes, and ranks them itself: a trim costs what its space holds (about a
-- microsecond an entry; the default cap is 200), where a score write, far more frequent, now
-- costs what the row does. Writers set these columns as they did (the triggers of
-- 20261124000009); nothing else reads the dropped indexes.
DROP INDEX IF EXISTS memory_retention_trim_order;
DROP INDEX IF EXISTS memory_retention_protected_order;
DROP INDEX IF EXISTS memory_retention_scored_at;

CREATE INDEX memory_retention_space ON memory_retention (user_id, space);
