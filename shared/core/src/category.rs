//! The two memory models, categories of semantic memories and speaker roles, with their stored
//! (text) forms.

use std::fmt;

/// Which of the two memory models an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// A fact: what an explicit Remember creates, or what consolidation derives.
    Semantic,
    /// A segment of conversation with a title, a summary and FSRS state.
    Episodic,
}

impl MemoryKind {
    /// The form stored in Postgres (`memories.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Semantic => "semantic",
            MemoryKind::Episodic => "episodic",
        }
    }

    pub fn from_stored(stored: &str) -> Option<Self> {
        match stored {
            "semantic" => Some(MemoryKind::Semantic),
            "episodic" => Some(MemoryKind::Episodic),
            _ => None,
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of fact a semantic memory states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    Fact,
    Preference,
    Experience,
    Guideline,
    Decision,
    Todo,
    Goal,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Fact,
        Category::Preference,
        Category::Experience,
        Category::Guideline,
        Category::Decision,
        Category::Todo,
        Category::Goal,
    ];

    /// The form stored in Postgres and shown in Markdown (`[preference] ...`).
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Fact => "fact",
            Category::Preference => "preference",
            Category::Experience => "experience",
            Category::Guideline => "guideline",
            Category::Decision => "decision",
            Category::Todo => "todo",
            Category::Goal => "goal",
        }
    }

    pub fn from_stored(stored: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|category| category.as_str() == stored)
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who said the text a memory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SpeakerRole {
    #[default]
    User,
    Assistant,
    System,
}

impl SpeakerRole {
    pub fn as_str(self) -> &'static str {
        match self {
            SpeakerRole::User => "user",
            SpeakerRole::Assistant => "assistant",
            SpeakerRole::System => "system",
        }
    }

    pub fn from_stored(stored: &str) -> Option<Self> {
        [
            SpeakerRole::User,
            SpeakerRole::Assistant,
            SpeakerRole::System,
        ]
        .into_iter()
        .find(|role| role.as_str() == stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_forms_round_trip() {
        for category in Category::ALL {
            assert_eq!(Category::from_stored(category.as_str()), Some(category));
        }
        assert_eq!(Category::from_stored("nonsense"), None);
        assert_eq!(
            SpeakerRole::from_stored("assistant"),
            Some(SpeakerRole::Assistant)
        );
    }
}
