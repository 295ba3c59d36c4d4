-- Retrievals' metrics rows are written in batches a moment after the response
-- (recall::read_traces); a row of a conversation forgotten since the retrieval must not come back
-- after ForgetConversation deleted the conversation's rows. The batch looks the forget up here.
CREATE INDEX audit_events_forgotten_conversations ON audit_events (user_id, space, conversation_id)
    WHERE action = 'forget_conversation';
