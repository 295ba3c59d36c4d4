-- The last entry a conversation's turns created or merged ($1 user, $2 space, $3 conversation;
-- derived facts aside): its id, whether it still exists, whether a privacy switch of the
-- conversation or the space came after it, and whether a later Remember of the conversation was
-- suppressed.
WITH last_write AS (
    SELECT a.id, a.memory_id FROM audit_events a
    WHERE a.user_id = $1 AND a.space = $2 AND a.conversation_id = $3
      AND a.action IN ('create', 'merge') AND a.conversation_id IS NOT NULL
      AND a.memory_id IS NOT NULL AND NOT a.detail @> '{"derived": true}'
    ORDER BY a.id DESC LIMIT 1)
SELECT w.memory_id,
       EXISTS (SELECT 1 FROM memories m
               WHERE m.id = w.memory_id AND m.user_id = $1 AND m.space = $2),
       EXISTS (SELECT 1 FROM audit_events later
               WHERE later.user_id = $1 AND later.space = $2 AND later.id > w.id
                 AND ((later.conversation_id = $3
                       AND later.action IN ('incognito_start', 'incognito_end', 'settings_change'))
                      OR (later.action = 'settings_change'
                          AND (later.detail -> 'before' -> 'memory_enabled'
                                   IS DISTINCT FROM later.detail -> 'after' -> 'memory_enabled'
                               OR later.detail -> 'before' -> 'incognito_default'
                                   IS DISTINCT FROM later.detail -> 'after' -> 'incognito_default')))),
       EXISTS (SELECT 1 FROM audit_events later
               WHERE later.user_id = $1 AND later.space = $2 AND later.id > w.id
                 AND later.conversation_id = $3 AND later.action = 'suppress')
FROM last_write w
