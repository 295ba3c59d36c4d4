-- Conversations turn into memory: turns are appended in order (cold storage), segmented into
-- episodes, and consolidated into facts; facts that contradict older ones supersede them.

-- Turn order is allocated from the conversation row (its lock serializes appenders, so turns are
-- never lost, duplicated or reordered), and segmentation keeps its progress there: turns are
-- immutable, so nothing about them is ever written back.
ALTER TABLE conversations
    ADD COLUMN next_turn_index         integer     NOT NULL DEFAULT 0,
    -- The last turn inside a closed segment (-1: none yet); later turns are the open segment.
    ADD COLUMN segmented_through       integer     NOT NULL DEFAULT -1,
    -- An explicit close (CloseSegment, or AppendMessages with close_segment) up to this turn.
    ADD COLUMN close_requested_through integer     NULL,
    -- When the last turn was said (client time), and when it arrived (ours: idleness is
    -- measured from it, so a history imported with old times is not idle at once).
    ADD COLUMN last_turn_at            timestamptz NULL,
    ADD COLUMN last_appended_at        timestamptz NULL;

-- Conversations with an open segment, least recently appended first: the idle sweep's lookup.
CREATE INDEX conversations_open_segments ON conversations (last_appended_at)
    WHERE next_turn_index - 1 > segmented_through;

ALTER TABLE conversation_turns
    -- When the turn was said: the client's time (histories imported with their real times), or
    -- the time it arrived.
    ADD COLUMN spoken_at         timestamptz NOT NULL DEFAULT now(),
    -- The client's id of the message: appending it again appends nothing.
    ADD COLUMN client_message_id text        NULL,
    -- o200k_base tokens of the content (segment size rule).
    ADD COLUMN tokens            integer     NOT NULL DEFAULT 0 CHECK (tokens >= 0);

CREATE UNIQUE INDEX conversation_turns_client_message
    ON conversation_turns (user_id, space, conversation_id, client_message_id)
    WHERE client_message_id IS NOT NULL;

-- Turn embeddings for topic-shift boundaries (turns are immutable, so they live beside them).
CREATE TABLE conversation_turn_embeddings (
    user_id          uuid        NOT NULL,
    space            text        NOT NULL,
    conversation_id  uuid        NOT NULL,
    turn_index       integer     NOT NULL,
    embedding        vector(384) NOT NULL,
    PRIMARY KEY (user_id, space, conversation_id, turn_index),
    FOREIGN KEY (user_id, space, conversation_id, turn_index)
        REFERENCES conversation_turns (user_id, space, conversation_id, turn_index) ON DELETE CASCADE
);

ALTER TABLE memories
    -- Facts consolidated from episodes: every episode that supports the fact.
    ADD COLUMN source_episode_ids uuid[] NOT NULL DEFAULT '{}',
    -- A fact that states a value of a subject ("my manager is ...": subject "manager"): a newer
    -- valid fact of the same subject with another value supersedes it (invalid_at set).
    ADD COLUMN fact_subject       text   NULL,
    -- The fact that superseded this one.
    ADD COLUMN superseded_by      uuid   NULL,
    -- Episodes: what the segment established (facts, preferences, decisions, todos, entities).
    ADD COLUMN structured_summary jsonb  NULL;

-- Facts an episode supports (forgetting a conversation), and the valid facts of a subject.
CREATE INDEX memories_source_episodes ON memories USING gin (source_episode_ids)
    WHERE source_episode_ids <> '{}';
CREATE INDEX memories_fact_subjects ON memories (user_id, space, fact_subject)
    WHERE fact_subject IS NOT NULL AND invalid_at IS NULL;
-- Episodes still to consolidate (the consolidation sweep).
CREATE INDEX memories_unconsolidated_episodes ON memories (created_at)
    WHERE kind = 'episodic' AND consolidated_at IS NULL;

-- The value a fact states of its subject (normalised), compared with newer facts' values.
ALTER TABLE memories ADD COLUMN fact_value text NULL;

-- New audit actions: a fact superseded by a newer one, a conversation forgotten, a segment closed.
ALTER DOMAIN engram_audit_action DROP CONSTRAINT engram_audit_action_check;
ALTER DOMAIN engram_audit_action ADD CONSTRAINT engram_audit_action_check CHECK (VALUE IN ('create',
    'merge', 'pin', 'unpin', 'forget', 'settings_change', 'incognito_start', 'incognito_end',
    'trim', 'import', 'suppress', 'supersede', 'forget_conversation', 'segment'));
