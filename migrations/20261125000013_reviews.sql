-- Reviews: every rating the review service applied to a memory, keyed by the segment that asked
-- for it, so that the same SegmentClosed delivered twice applies nothing twice. Also what
-- GetReviewStats counts.
CREATE TABLE applied_reviews (
    segment_id         uuid             NOT NULL,
    memory_id          uuid             NOT NULL,
    user_id            uuid             NOT NULL,
    space              text             NOT NULL,
    conversation_id    uuid             NULL,
    rating             text             NOT NULL CHECK (rating IN ('again', 'hard', 'good', 'easy')),
    -- llm, local, or local (after the LLM failed)
    graded_by          text             NOT NULL,
    -- skipped: stale (the memory was reviewed at or after this review's time) or not an episode
    applied            boolean          NOT NULL,
    stability_before   double precision NULL,
    stability_after    double precision NULL,
    difficulty_before  double precision NULL,
    difficulty_after   double precision NULL,
    queries            text[]           NOT NULL DEFAULT '{}',
    reviewed_at        timestamptz      NOT NULL,
    created_at         timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (segment_id, memory_id)
);

CREATE INDEX applied_reviews_scope ON applied_reviews (user_id, space, created_at);

-- A review is audited, as every change to a memory.
ALTER DOMAIN engram_audit_action DROP CONSTRAINT engram_audit_action_check;
ALTER DOMAIN engram_audit_action ADD CONSTRAINT engram_audit_action_check CHECK (VALUE IN ('create',
    'merge', 'pin', 'unpin', 'forget', 'settings_change', 'incognito_start', 'incognito_end',
    'trim', 'import', 'suppress', 'supersede', 'forget_conversation', 'segment', 'review'));
