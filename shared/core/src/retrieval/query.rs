//! What a query says about where to look. Retrieval searches the conversation first and widens to
//! the whole space when the conversation offers too little, or when the query points at the past
//! ("last time", "previously", "之前", "上次" ...): such a question is about other conversations.

use std::sync::LazyLock;

use regex::Regex;

/// Characters of a query: RetrieveMemory's, and the queries a memory to grade was retrieved by
/// (GradeMemories), which are such queries.
pub const MAX_QUERY_CHARS: usize = 2_048;

static PAST_REFERENCE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:before|earlier|previously|last\s+(?:time|week|month|year|session|conversation|chat)|(?:the\s+)?other\s+day|a\s+while\s+ago|in\s+the\s+past|used\s+to|we\s+(?:talked|discussed|spoke)|(?:i|you)\s+(?:told|mentioned|said)|remember\s+when)\b|之前|以前|上次|上回|先前|曾经|那次|过去",
    )
    .expect("valid past-reference pattern")
});

/// Whether the query refers to earlier conversations.
pub fn refers_to_the_past(query: &str) -> bool {
    PAST_REFERENCE.is_match(query)
}

/// Where a search looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchScope {
    /// Only entries written from the request's conversation.
    Conversation,
    /// Every entry of the space.
    Space,
}

/// The scope to try first: the conversation, unless there is none or the query looks back.
pub fn initial_scope(has_conversation: bool, query: &str) -> SearchScope {
    if has_conversation && !refers_to_the_past(query) {
        SearchScope::Conversation
    } else {
        SearchScope::Space
    }
}

/// Whether a conversation-scoped search found too little and the space should be searched.
pub fn should_widen(scope: SearchScope, sparse_hits: usize, min_sparse_hits: usize) -> bool {
    scope == SearchScope::Conversation && sparse_hits < min_sparse_hits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_references_to_earlier_conversations() {
        for query in [
            "what did I say about Rust before?",
            "Like we discussed last time",
            "you mentioned a restaurant",
            "我之前说过的那本书",
            "上次的会议",
            "以前的工作",
        ] {
            assert!(refers_to_the_past(query), "{query}");
        }
        for query in [
            "what is my favourite colour",
            "beforehand is not a word here",
            "今天的天气",
        ] {
            assert!(!refers_to_the_past(query), "{query}");
        }
    }

    #[test]
    fn starts_in_the_conversation_and_widens_when_it_finds_little() {
        assert_eq!(
            initial_scope(true, "my editor settings"),
            SearchScope::Conversation
        );
        assert_eq!(
            initial_scope(true, "the editor I used before"),
            SearchScope::Space
        );
        assert_eq!(
            initial_scope(false, "my editor settings"),
            SearchScope::Space
        );
        assert!(should_widen(SearchScope::Conversation, 1, 3));
        assert!(!should_widen(SearchScope::Conversation, 3, 3));
        assert!(!should_widen(SearchScope::Space, 0, 3));
    }
}
