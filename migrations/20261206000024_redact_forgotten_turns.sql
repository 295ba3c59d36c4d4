-- Stored turns stay immutable, with one exception: a Forget cuts the forgotten fact out of the
-- turns that said it (issue 39: after "forget that", no table may still hold it). The redaction
-- sets `engram.redacting` for its own statement (set_config(..., true): the transaction only)
-- and may then rewrite a turn's content; a turn's conversation, place, speaker and time never
-- change, and nothing else may update a turn.
CREATE OR REPLACE FUNCTION conversation_turns_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('engram.redacting', true) = 'on'
       AND NEW.user_id = OLD.user_id AND NEW.space = OLD.space
       AND NEW.conversation_id = OLD.conversation_id AND NEW.turn_index = OLD.turn_index
       AND NEW.role = OLD.role AND NEW.spoken_at IS NOT DISTINCT FROM OLD.spoken_at THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'conversation turns are immutable' USING ERRCODE = 'restrict_violation';
END $$;
