-- A Remember that a tombstone suppressed (the same text was forgotten less than the tombstone's
-- lifetime ago) is audited as 'suppress'. Nothing is written for it, and without a trace of it a
-- later "forget that" or "pin this" in the same conversation took the conversation's previous
-- memory for "that", and deleted or pinned what the user did not mean.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_action_check;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_action_check CHECK (action IN ('create', 'merge',
    'pin', 'unpin', 'forget', 'settings_change', 'incognito_start', 'incognito_end', 'trim', 'import',
    'suppress'));
