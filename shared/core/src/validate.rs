//! Validated request values. Each newtype can only be built through `parse`, so a handler that
//! holds one knows the value is well-formed; the error names the field and what was wrong.

use std::fmt;

use uuid::Uuid;

/// What was wrong with one field of a request. Rendered as `"<field>: <reason>"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ValidationError {
    pub field: String,
    pub reason: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

fn parse_uuid(field: &str, raw: &str) -> Result<Uuid, ValidationError> {
    if raw.is_empty() {
        return Err(ValidationError::new(field, "is required"));
    }
    let id = Uuid::parse_str(raw).map_err(|_| {
        ValidationError::new(
            field,
            format!("must be a UUID, got {:?}", truncate_for_message(raw)),
        )
    })?;
    // The all-zero UUID is what a client sends when it forgot to set an id.
    if id.is_nil() {
        return Err(ValidationError::new(field, "must not be the nil UUID"));
    }
    Ok(id)
}

/// Whether a text shows nothing to a reader (empty, whitespace, invisible characters only).
fn is_blank(text: &str) -> bool {
    text.chars().all(is_invisible)
}

/// A character that shows nothing to a reader: whitespace, a control, or a default-ignorable
/// format character (zero-width space, BOM, ...). A text of only these is blank.
fn is_invisible(c: char) -> bool {
    c.is_whitespace() || c.is_control() || crate::normalize::is_default_ignorable(c)
}

/// Keeps error messages short when a client sends something huge.
fn truncate_for_message(raw: &str) -> String {
    const MAX: usize = 64;
    if raw.chars().count() <= MAX {
        raw.to_owned()
    } else {
        let head: String = raw.chars().take(MAX).collect();
        format!("{head}…")
    }
}

macro_rules! uuid_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            pub fn parse(field: &str, raw: &str) -> Result<Self, ValidationError> {
                parse_uuid(field, raw).map(Self)
            }

            pub fn from_uuid(id: Uuid) -> Self {
                Self(id)
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

uuid_newtype!(
    /// The owning user of every row.
    UserId
);
uuid_newtype!(
    /// A memory entry (semantic or episodic).
    MemoryId
);
uuid_newtype!(
    /// A conversation, the unit of incognito and of "forget that".
    ConversationId
);

/// A space name: a namespace or project inside one user's memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpaceName(String);

impl SpaceName {
    pub const MAX_CHARS: usize = 128;

    pub fn parse(field: &str, raw: &str) -> Result<Self, ValidationError> {
        if raw.is_empty() {
            return Err(ValidationError::new(field, "is required"));
        }
        if raw.chars().count() > Self::MAX_CHARS {
            return Err(ValidationError::new(
                field,
                format!("must be at most {} characters", Self::MAX_CHARS),
            ));
        }
        let allowed = |c: char| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/');
        if let Some(bad) = raw.chars().find(|c| !allowed(*c)) {
            return Err(ValidationError::new(
                field,
                format!("may hold only letters, digits, '-', '_', '.', ':' and '/', found {bad:?}"),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SpaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The tenancy key: every row belongs to one (user, space) and every query is scoped by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub user_id: UserId,
    pub space: SpaceName,
}

impl Scope {
    /// Parses the `scope` message of a request; `field` is its name in the request.
    pub fn parse(field: &str, user_id: &str, space: &str) -> Result<Self, ValidationError> {
        Ok(Self {
            user_id: UserId::parse(&format!("{field}.user_id"), user_id)?,
            space: SpaceName::parse(&format!("{field}.space"), space)?,
        })
    }
}

/// The text of a memory as the user gave it, less what only steers a display (escape sequences,
/// controls, bidi overrides: [`crate::sanitize`]): something visible, within the configured
/// length. Every free text of a request (memory text, titles, turns, queries, command messages)
/// is parsed through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryText(String);

impl MemoryText {
    pub fn parse(field: &str, raw: &str, max_chars: usize) -> Result<Self, ValidationError> {
        if raw.is_empty() {
            return Err(ValidationError::new(field, "must not be empty"));
        }
        if raw.contains('\0') {
            return Err(ValidationError::new(
                field,
                "must not contain NUL characters",
            ));
        }
        let cleaned = crate::sanitize::strip_steering(raw);
        if is_blank(&cleaned) {
            return Err(ValidationError::new(
                field,
                "must not be empty (it has no visible characters)",
            ));
        }
        let raw = cleaned.as_ref();
        let chars = raw.chars().count();
        if chars > max_chars {
            return Err(ValidationError::new(
                field,
                format!("is {chars} characters long; the limit is {max_chars}"),
            ));
        }
        Ok(Self(cleaned.into_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// A short label (a tag, a source id, a client's key or title): visible text within `max_chars`
/// characters, without control characters or bidi controls (an identifier is refused rather
/// than changed, so that a client's key stays what the client sent).
pub fn check_label(field: &str, label: &str, max_chars: usize) -> Result<(), ValidationError> {
    if is_blank(label) {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if label.chars().count() > max_chars {
        return Err(ValidationError::new(
            field,
            format!("must be at most {max_chars} characters"),
        ));
    }
    if let Some(control) = label
        .chars()
        .find(|c| c.is_control() || crate::sanitize::is_bidi_control(*c))
    {
        return Err(ValidationError::new(
            field,
            format!("must not contain control characters, found {control:?}"),
        ));
    }
    Ok(())
}

/// Validates a list of short labels (tags or source ids): trimmed, non-empty, bounded in number
/// and length. Duplicates are dropped, order kept.
pub fn parse_labels(
    field: &str,
    raw: &[String],
    max_items: usize,
    max_chars: usize,
) -> Result<Vec<String>, ValidationError> {
    if raw.len() > max_items {
        return Err(ValidationError::new(
            field,
            format!("has {} items; the limit is {max_items}", raw.len()),
        ));
    }
    let mut labels: Vec<String> = Vec::with_capacity(raw.len());
    for (index, item) in raw.iter().enumerate() {
        let label = item.trim();
        check_label(&format!("{field}[{index}]"), label, max_chars)?;
        if !labels.iter().any(|existing| existing == label) {
            labels.push(label.to_owned());
        }
    }
    Ok(labels)
}

/// Validates a page size: 0 means the default, otherwise 1..=max.
pub fn parse_page_size(
    field: &str,
    raw: u32,
    default: u32,
    max: u32,
) -> Result<u32, ValidationError> {
    match raw {
        0 => Ok(default),
        size if size <= max => Ok(size),
        size => Err(ValidationError::new(
            field,
            format!("is {size}; it must be between 1 and {max}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_id_must_be_a_uuid() {
        let error = UserId::parse("scope.user_id", "not-a-uuid").unwrap_err();
        assert_eq!(
            error.to_string(),
            "scope.user_id: must be a UUID, got \"not-a-uuid\""
        );
        assert_eq!(UserId::parse("u", "").unwrap_err().reason, "is required");
        assert!(UserId::parse("u", "6f1c1f4e-2f0b-4a4e-9a34-9d4f3f1e2a10").is_ok());
        assert_eq!(
            UserId::parse("u", "00000000-0000-0000-0000-000000000000")
                .unwrap_err()
                .reason,
            "must not be the nil UUID"
        );
    }

    #[test]
    fn space_names_are_bounded_and_plain() {
        assert!(SpaceName::parse("space", "work/theo-engine_v2:main").is_ok());
        assert!(SpaceName::parse("space", "工作").is_ok());
        assert!(SpaceName::parse("space", "").is_err());
        assert!(SpaceName::parse("space", "has space").is_err());
        assert!(SpaceName::parse("space", &"x".repeat(129)).is_err());
        assert!(SpaceName::parse("space", &"x".repeat(128)).is_ok());
    }

    #[test]
    fn memory_text_rejects_blank_and_oversized() {
        assert!(
            MemoryText::parse("text", "  \n", 10)
                .unwrap_err()
                .reason
                .starts_with("must not be empty")
        );
        assert_eq!(
            MemoryText::parse("text", "", 10).unwrap_err().reason,
            "must not be empty"
        );
        assert_eq!(
            MemoryText::parse("text", "abcdefghijk", 10)
                .unwrap_err()
                .reason,
            "is 11 characters long; the limit is 10"
        );
        // Zero-width spaces, joiners and a BOM are as blank as spaces.
        assert!(
            MemoryText::parse("text", "\u{200b}\u{200b} \u{feff}\u{2060}", 10)
                .unwrap_err()
                .reason
                .starts_with("must not be empty")
        );
        // What only steers a display is removed; a text of nothing else is empty.
        assert_eq!(
            MemoryText::parse("text", "\u{1b}[31mred\u{1b}[0m", 10)
                .unwrap()
                .as_str(),
            "red"
        );
        assert!(MemoryText::parse("text", "\u{1b}[2J\u{202e}", 10).is_err());
        // An emoji joined by zero-width joiners is text.
        assert!(MemoryText::parse("text", "\u{1f468}\u{200d}\u{1f469}", 10).is_ok());
        // The limit counts characters, not bytes.
        assert!(MemoryText::parse("text", "记住我喜欢喝绿茶", 8).is_ok());
    }

    #[test]
    fn labels_are_trimmed_deduplicated_and_bounded() {
        let labels = parse_labels("tags", &[" a ".into(), "b".into(), "a".into()], 4, 8).unwrap();
        assert_eq!(labels, vec!["a", "b"]);
        assert_eq!(
            parse_labels("tags", &["".into()], 4, 8).unwrap_err().field,
            "tags[0]"
        );
        assert!(parse_labels("tags", &vec!["x".to_owned(); 5], 4, 8).is_err());
        assert!(parse_labels("tags", &["123456789".into()], 4, 8).is_err());
        assert_eq!(
            parse_labels("tags", &["ok".into(), "a\u{7}\u{1b}[31m".into()], 4, 16)
                .unwrap_err()
                .to_string(),
            "tags[1]: must not contain control characters, found '\\u{7}'"
        );
        assert!(parse_labels("tags", &["\u{200b}".into()], 4, 8).is_err());
    }

    #[test]
    fn page_size_defaults_and_bounds() {
        assert_eq!(parse_page_size("page_size", 0, 50, 500), Ok(50));
        assert_eq!(parse_page_size("page_size", 500, 50, 500), Ok(500));
        assert!(parse_page_size("page_size", 501, 50, 500).is_err());
    }
}
