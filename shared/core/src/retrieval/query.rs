//! Limits of a query. Retrieval always searches the whole space; the entries of the request's
//! conversation are preferred in the ranking (`ranking::REQUEST_CONVERSATION_BOOST`). It once
//! searched the conversation first and widened to the space only when the conversation offered
//! too little or the query pointed at the past, and so missed an episode of another session that
//! held the answer (issue 38).

/// Characters of a query: RetrieveMemory's, and the queries a memory to grade was retrieved by
/// (GradeMemories), which are such queries.
pub const MAX_QUERY_CHARS: usize = 2_048;
