-- AppendMessages in one round trip: the whole append (the space's privacy lock, the privacy
-- check, the conversation's row lock, idempotency by client message id, the order of the turns'
-- times, the turns, the conversation's progress and the segmentation request in the outbox) runs
-- as one statement in its own transaction, which commits when the statement returns.
--
-- Why a function: the append used to be four round trips (BEGIN with the lock, open, record,
-- COMMIT). On a busy host every round trip is two wake-ups of two processes, and in the
-- conversations benchmark the round trips, not the statements' work (about 0.3 ms of the
-- server's time in all), made the appends' tail. A single plain statement cannot do it: its
-- snapshot would be taken before it waits for the privacy lock, so it could miss a switch to
-- memory off that committed meanwhile. Each statement of a PL/pgSQL function takes a new
-- snapshot, so everything after the lock sees the switches as they are.
--
-- Nothing is written when the append is refused (memory off, incognito), when every message is a
-- duplicate (and no close is asked for), or when a turn's time is before the turn said before it
-- (`out_of_order_position`), or when a lock is not had within `p_lock_timeout_ms` (SQLSTATE
-- 55P03: the caller's request ran out of time first). engram_store::conversations::append_turns
-- is its only caller.
CREATE FUNCTION engram_append_turns(
    p_privacy_lock       bigint,
    p_user_id            uuid,
    p_space              text,
    p_conversation_id    uuid,
    p_roles              text[],
    p_contents           text[],
    -- NULL: said now (or at the last turn's time, when a client's clock put that ahead of ours).
    p_spoken_at          timestamptz[],
    p_client_message_ids text[],
    p_tokens             int4[],
    p_now                timestamptz,
    p_close              boolean,
    -- NULL: no segmentation request in the outbox (the bus is off). Otherwise a pending request
    -- younger than this many seconds is not asked for again.
    p_renew_request_after_secs float8,
    p_event_message_id   uuid,
    p_event_routing_key  text,
    p_event_type_name    text,
    p_event_payload      bytea,
    p_event_trace_headers jsonb,
    -- The longest wait for each lock (NULL: the session's lock_timeout).
    p_lock_timeout_ms    int8,
    OUT memory_enabled   boolean,
    OUT refused          boolean,
    -- Per message, in order: its turn index, and whether it was there already (a resend).
    OUT turn_indexes     int4[],
    OUT duplicates       boolean[],
    -- The first message (0-based) said before the turn before it, with both times.
    OUT out_of_order_position int4,
    OUT out_of_order_at  timestamptz,
    OUT out_of_order_after timestamptz,
    OUT queued           boolean)
LANGUAGE plpgsql
-- Every statement is keyed by the conversation: a generic plan is the plan, without re-planning.
SET plan_cache_mode = force_generic_plan
AS $function$
DECLARE
    message_count int4 := coalesce(array_length(p_roles, 1), 0);
    conversation_incognito boolean;
    conversation_exists boolean;
    next_index int4;
    last_at timestamptz;
    requested_at timestamptz;
    known jsonb;
    spoken timestamptz;
    new_indexes int4[];
    new_positions int4[];
    new_spoken_at timestamptz[];
    claimed boolean;
    -- How many turns are new (not duplicates).
    stored int4 := 0;
BEGIN
    -- The fresh snapshot of each statement below is what makes the lock work.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'engram_append_turns needs READ COMMITTED, not %',
            current_setting('transaction_isolation');
    END IF;
    queued := false;
    IF p_lock_timeout_ms IS NOT NULL THEN
        -- 0 would mean no limit.
        PERFORM set_config('lock_timeout', greatest(p_lock_timeout_ms, 1) || 'ms', true);
    END IF;
    PERFORM pg_advisory_xact_lock_shared(p_privacy_lock);

    SELECT coalesce(c.incognito, s.incognito_default, false), coalesce(s.memory_enabled, true)
      INTO conversation_incognito, memory_enabled
      FROM (SELECT 1) AS one
      LEFT JOIN spaces s ON s.user_id = p_user_id AND s.space = p_space
      LEFT JOIN conversations c
        ON c.user_id = p_user_id AND c.space = p_space AND c.conversation_id = p_conversation_id;
    refused := conversation_incognito OR NOT memory_enabled;
    IF refused THEN
        RETURN;
    END IF;

    -- Two appends to a new conversation both find no row; the one whose insert loses reads the
    -- winner's row (after it commits) and starts again from it.
    LOOP
        SELECT c.next_turn_index, c.last_turn_at, c.segmentation_requested_at
          INTO next_index, last_at, requested_at
          FROM conversations c
         WHERE c.user_id = p_user_id AND c.space = p_space AND c.conversation_id = p_conversation_id
           FOR UPDATE;
        conversation_exists := FOUND;
        IF NOT conversation_exists THEN
            next_index := 0;
            last_at := NULL;
            requested_at := NULL;
        END IF;

        SELECT coalesce(jsonb_object_agg(t.client_message_id, t.turn_index), '{}'::jsonb)
          INTO known
          FROM conversation_turns t
         WHERE conversation_exists
           AND t.user_id = p_user_id AND t.space = p_space AND t.conversation_id = p_conversation_id
           AND t.client_message_id = ANY (p_client_message_ids);

        turn_indexes := '{}';
        duplicates := '{}';
        new_indexes := '{}';
        new_positions := '{}';
        new_spoken_at := '{}';
        FOR i IN 1 .. message_count LOOP
            IF known ->> p_client_message_ids[i] IS NOT NULL THEN
                turn_indexes := turn_indexes || (known ->> p_client_message_ids[i])::int4;
                duplicates := duplicates || true;
                CONTINUE;
            END IF;
            spoken := coalesce(p_spoken_at[i], greatest(p_now, last_at));
            IF spoken < last_at THEN
                out_of_order_position := i - 1;
                out_of_order_at := spoken;
                out_of_order_after := last_at;
                RETURN;
            END IF;
            last_at := spoken;
            IF p_client_message_ids[i] IS NOT NULL THEN
                known := known || jsonb_build_object(p_client_message_ids[i], next_index);
            END IF;
            turn_indexes := turn_indexes || next_index;
            duplicates := duplicates || false;
            new_indexes := new_indexes || next_index;
            new_positions := new_positions || i;
            new_spoken_at := new_spoken_at || spoken;
            next_index := next_index + 1;
        END LOOP;
        stored := coalesce(array_length(new_indexes, 1), 0);

        IF stored = 0 AND NOT p_close THEN
            RETURN;
        END IF;
        EXIT WHEN conversation_exists;
        INSERT INTO conversations (user_id, space, conversation_id)
        VALUES (p_user_id, p_space, p_conversation_id)
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
    END LOOP;

    INSERT INTO conversation_turns (user_id, space, conversation_id, turn_index, role, content,
                                    spoken_at, client_message_id, tokens)
    SELECT p_user_id, p_space, p_conversation_id, n.turn_index, p_roles[n.message],
           p_contents[n.message], n.spoken_at, p_client_message_ids[n.message],
           p_tokens[n.message]
      FROM unnest(new_indexes, new_positions, new_spoken_at) AS n(turn_index, message, spoken_at);

    -- A conversation with turns asks segmentation to look at it, unless a request is pending
    -- already (its pass reads these turns too) and is younger than the renewal age.
    claimed := p_renew_request_after_secs IS NOT NULL AND next_index > 0
               AND (requested_at IS NULL
                    OR requested_at < now() - make_interval(secs => p_renew_request_after_secs));
    UPDATE conversations c
       SET next_turn_index = next_index,
           last_turn_at = CASE WHEN stored > 0 THEN last_at ELSE c.last_turn_at END,
           last_appended_at = CASE WHEN stored > 0 THEN now() ELSE c.last_appended_at END,
           close_requested_through = CASE WHEN p_close AND next_index - 1 > c.segmented_through
                                          THEN next_index - 1 ELSE c.close_requested_through END,
           updated_at = now(),
           segmentation_requested_at = CASE WHEN claimed THEN now()
                                            ELSE c.segmentation_requested_at END
     WHERE c.user_id = p_user_id AND c.space = p_space AND c.conversation_id = p_conversation_id;

    IF claimed THEN
        INSERT INTO outbox_events (message_id, routing_key, type_name, payload, trace_headers)
        VALUES (p_event_message_id, p_event_routing_key, p_event_type_name, p_event_payload,
                p_event_trace_headers);
        queued := true;
    END IF;
END;
$function$;
