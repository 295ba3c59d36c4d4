-- Engram's store: one memory model for semantic facts and episodic memories, the immutable
-- conversation record, per-space settings, tombstones of forgotten memories, the audit trail of
-- user actions, and per-request retrieval metrics. Every row belongs to one (user_id, space).

CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS pg_trgm;

-- Per-space settings and the live entry count the capacity policy reads on every write.
CREATE TABLE spaces (
    user_id            uuid        NOT NULL,
    space              text        NOT NULL,
    memory_enabled     boolean     NOT NULL DEFAULT true,
    incognito_default  boolean     NOT NULL DEFAULT false,
    -- NULL: the global default soft cap applies.
    soft_cap           integer     NULL CHECK (soft_cap IS NULL OR soft_cap BETWEEN 1 AND 1000000),
    -- Maintained by triggers on memories; never written by application code.
    memory_count       bigint      NOT NULL DEFAULT 0 CHECK (memory_count >= 0),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, space)
);

-- Both memory kinds share the entry fields of the write path; kind-specific columns are NULL for
-- the other kind (CHECK constraints below keep each kind complete).
CREATE TABLE memories (
    id                  uuid        PRIMARY KEY,
    user_id             uuid        NOT NULL,
    space               text        NOT NULL,
    kind                text        NOT NULL CHECK (kind IN ('semantic', 'episodic')),
    -- Conversation the entry was first written from (semantic) or segments (episodic).
    conversation_id     uuid        NULL,
    -- Semantic: the fact as given. Episodic: the summary.
    text                text        NOT NULL CHECK (length(text) > 0),
    role                text        NOT NULL DEFAULT 'user' CHECK (role IN ('user', 'assistant', 'system')),

    -- Semantic facts.
    category            text        NULL CHECK (category IN ('fact', 'preference', 'experience', 'guideline', 'decision', 'todo', 'goal')),
    valid_at            timestamptz NULL,
    invalid_at          timestamptz NULL,

    -- Episodic memories.
    title               text        NULL,
    messages            jsonb       NULL,
    surprise            double precision NULL CHECK (surprise BETWEEN 0 AND 1),
    start_at            timestamptz NULL,
    end_at              timestamptz NULL,
    stability           double precision NULL CHECK (stability > 0),
    difficulty          double precision NULL CHECK (difficulty BETWEEN 1 AND 10),
    last_reviewed_at    timestamptz NULL,
    consolidated_at     timestamptz NULL,

    -- Entry fields shared by both kinds.
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    embedding           vector(384) NULL,
    embedding_model     text        NULL,
    needs_embedding     boolean     NOT NULL DEFAULT true,
    simhash             bigint      NOT NULL,
    repeat_count        integer     NOT NULL DEFAULT 0 CHECK (repeat_count >= 0),
    tags                text[]      NOT NULL DEFAULT '{}',
    source_ids          text[]      NOT NULL DEFAULT '{}',
    metadata_confidence double precision NOT NULL DEFAULT 0 CHECK (metadata_confidence BETWEEN 0 AND 1),
    importance          double precision NOT NULL CHECK (importance BETWEEN 0 AND 1),
    pinned              boolean     NOT NULL DEFAULT false,
    manually_saved      boolean     NOT NULL DEFAULT false,
    -- {relevance, recency, importance, total, computed_at}
    last_scores         jsonb       NULL,

    -- The four 16-bit bands of the SimHash: two fingerprints within Hamming distance 3 share at
    -- least one band, so near-duplicate lookup is four index probes, never a scan of the space.
    simhash_band0       integer     GENERATED ALWAYS AS ((simhash & 65535)::integer) STORED,
    simhash_band1       integer     GENERATED ALWAYS AS (((simhash >> 16) & 65535)::integer) STORED,
    simhash_band2       integer     GENERATED ALWAYS AS (((simhash >> 32) & 65535)::integer) STORED,
    simhash_band3       integer     GENERATED ALWAYS AS (((simhash >> 48) & 65535)::integer) STORED,

    CONSTRAINT semantic_fields CHECK (kind <> 'semantic' OR (category IS NOT NULL AND valid_at IS NOT NULL)),
    CONSTRAINT episodic_fields CHECK (kind <> 'episodic' OR (
        title IS NOT NULL AND messages IS NOT NULL AND surprise IS NOT NULL AND start_at IS NOT NULL
        AND end_at IS NOT NULL AND stability IS NOT NULL AND difficulty IS NOT NULL
        AND last_reviewed_at IS NOT NULL AND conversation_id IS NOT NULL))
);

CREATE INDEX memories_scope_created ON memories (user_id, space, created_at DESC, id DESC);
CREATE INDEX memories_scope_band0 ON memories (user_id, space, simhash_band0);
CREATE INDEX memories_scope_band1 ON memories (user_id, space, simhash_band1);
CREATE INDEX memories_scope_band2 ON memories (user_id, space, simhash_band2);
CREATE INDEX memories_scope_band3 ON memories (user_id, space, simhash_band3);
CREATE INDEX memories_needing_embedding ON memories (created_at) WHERE needs_embedding;
CREATE INDEX memories_scope_protected ON memories (user_id, space) WHERE pinned OR manually_saved;

-- Keeps spaces.memory_count exact whoever writes memories (ingest, import, segmentation).
CREATE FUNCTION memories_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO spaces (user_id, space, memory_count)
    SELECT user_id, space, count(*) FROM new_rows GROUP BY user_id, space
    ON CONFLICT (user_id, space)
    DO UPDATE SET memory_count = spaces.memory_count + EXCLUDED.memory_count;
    RETURN NULL;
END $$;

CREATE FUNCTION memories_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE spaces s SET memory_count = s.memory_count - d.removed
    FROM (SELECT user_id, space, count(*) AS removed FROM old_rows GROUP BY user_id, space) d
    WHERE s.user_id = d.user_id AND s.space = d.space;
    RETURN NULL;
END $$;

CREATE TRIGGER memories_count_after_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memories_count_insert();
CREATE TRIGGER memories_count_after_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION memories_count_delete();

-- Per-conversation state: incognito, and the reviews retrieval left pending for segmentation.
CREATE TABLE conversations (
    user_id          uuid        NOT NULL,
    space            text        NOT NULL,
    conversation_id  uuid        NOT NULL,
    -- NULL: the space's incognito_default applies.
    incognito        boolean     NULL,
    -- JSON array of {query, memory_ids}; NULL when none are pending.
    pending_reviews  jsonb       NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, space, conversation_id)
);

-- Raw conversation turns, kept immutable (cold storage): inserted once, never updated.
CREATE TABLE conversation_turns (
    user_id          uuid        NOT NULL,
    space            text        NOT NULL,
    conversation_id  uuid        NOT NULL,
    turn_index       integer     NOT NULL CHECK (turn_index >= 0),
    role             text        NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
    content          text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, space, conversation_id, turn_index)
);

CREATE FUNCTION conversation_turns_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'conversation turns are immutable' USING ERRCODE = 'restrict_violation';
END $$;

CREATE TRIGGER conversation_turns_no_update BEFORE UPDATE ON conversation_turns
    FOR EACH ROW EXECUTE FUNCTION conversation_turns_immutable();

-- Digests of forgotten memories: a near-duplicate of one is not re-created before expires_at.
-- Only the fingerprint and a hash of the normalized text are kept, never the text itself.
CREATE TABLE tombstones (
    id                  bigserial   PRIMARY KEY,
    user_id             uuid        NOT NULL,
    space               text        NOT NULL,
    memory_id           uuid        NOT NULL,
    simhash             bigint      NOT NULL,
    text_digest         bytea       NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    simhash_band0       integer     GENERATED ALWAYS AS ((simhash & 65535)::integer) STORED,
    simhash_band1       integer     GENERATED ALWAYS AS (((simhash >> 16) & 65535)::integer) STORED,
    simhash_band2       integer     GENERATED ALWAYS AS (((simhash >> 32) & 65535)::integer) STORED,
    simhash_band3       integer     GENERATED ALWAYS AS (((simhash >> 48) & 65535)::integer) STORED
);

CREATE INDEX tombstones_scope_band0 ON tombstones (user_id, space, simhash_band0);
CREATE INDEX tombstones_scope_band1 ON tombstones (user_id, space, simhash_band1);
CREATE INDEX tombstones_scope_band2 ON tombstones (user_id, space, simhash_band2);
CREATE INDEX tombstones_scope_band3 ON tombstones (user_id, space, simhash_band3);
CREATE INDEX tombstones_expiry ON tombstones (expires_at);

-- Every user action (and every trim), newest last; read per space.
CREATE TABLE audit_events (
    id               bigserial   PRIMARY KEY,
    user_id          uuid        NOT NULL,
    space            text        NOT NULL,
    action           text        NOT NULL CHECK (action IN ('create', 'merge', 'pin', 'unpin', 'forget',
                                     'settings_change', 'incognito_start', 'incognito_end', 'trim')),
    memory_id        uuid        NULL,
    conversation_id  uuid        NULL,
    detail           jsonb       NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX audit_events_scope ON audit_events (user_id, space, id DESC);
CREATE INDEX audit_events_conversation_writes ON audit_events (user_id, space, conversation_id, id DESC)
    WHERE action IN ('create', 'merge') AND conversation_id IS NOT NULL;

-- One row per retrieval request, for diagnosing "it forgot" (hit rates, fallbacks, budget).
CREATE TABLE retrieval_metrics (
    id                    bigserial   PRIMARY KEY,
    user_id               uuid        NOT NULL,
    space                 text        NOT NULL,
    conversation_id       uuid        NULL,
    created_at            timestamptz NOT NULL DEFAULT now(),
    query                 text        NOT NULL,
    sparse_hits           integer     NOT NULL DEFAULT 0,
    dense_hits            integer     NOT NULL DEFAULT 0,
    trigram_hits          integer     NOT NULL DEFAULT 0,
    used_fallback         boolean     NOT NULL DEFAULT false,
    retrieval_path        text        NOT NULL,
    ranking_profile       text        NOT NULL,
    scope_widened         boolean     NOT NULL DEFAULT false,
    context_items         integer     NOT NULL DEFAULT 0,
    estimated_tokens      integer     NOT NULL DEFAULT 0,
    truncated             boolean     NOT NULL DEFAULT false,
    latency_embed_ms      real        NULL,
    latency_retrieval_ms  real        NOT NULL,
    error_stage           text        NULL
);

CREATE INDEX retrieval_metrics_created ON retrieval_metrics (created_at);
CREATE INDEX retrieval_metrics_scope ON retrieval_metrics (user_id, space, created_at);
