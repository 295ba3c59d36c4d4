//! Paging for every listing RPC: page tokens that refuse what no earlier response could have
//! handed out, and pages bounded by their encoded size as well as by their count.
//!
//! gRPC clients refuse messages over 4 MiB by default (grpcurl, grpc-go, tonic, grpc-java), so a
//! page of 200 memories of 8,192 CJK characters (about 5 MB, within every per-entry limit) could
//! not be read by anyone. A page therefore ends early once its items reach
//! [`RESPONSE_BYTE_BUDGET`], and hands a token for the rest; one item is always returned, and the
//! write-side limits keep one item far below the budget.

use chrono::{DateTime, Utc};
use engram_core::ValidationError;
use uuid::Uuid;

use crate::time::is_supported;

/// What the items of one response may take when encoded: 3.5 MiB, leaving room under the 4 MiB
/// default of clients for the rest of the message (a page token, counts, the Markdown).
pub const RESPONSE_BYTE_BUDGET: usize = 3 * 1024 * 1024 + 512 * 1024;

/// How many of `items`, in order, one page takes: at most `max_items`, and no more than fit in
/// `byte_budget` once encoded as a repeated field, but always at least one when there is one.
pub fn fitting_count<T: prost::Message>(
    items: &[T],
    max_items: usize,
    byte_budget: usize,
) -> usize {
    let mut used = 0usize;
    let mut taken = 0usize;
    for item in items.iter().take(max_items) {
        let length = item.encoded_len();
        // A repeated message field costs its tag (one byte for Engram's low field numbers), the
        // length prefix, and the message.
        let cost = 1 + prost::encoding::encoded_len_varint(length as u64) + length;
        if taken > 0 && used + cost > byte_budget {
            break;
        }
        used += cost;
        taken += 1;
    }
    taken
}

/// The position of the last entry of a page of entries listed by (created_at, id): the page
/// token is `<created_at in microseconds>.<id>`, opaque to clients and stable under concurrent
/// inserts (keyset paging).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryCursor {
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

impl EntryCursor {
    pub fn token(&self) -> String {
        format!("{}.{}", self.created_at.timestamp_micros(), self.id)
    }

    /// Reads a page token; anything no response could have handed out (a time outside the years
    /// 1 to 9999 that Engram stores, a malformed id) is an InvalidArgument naming `field`.
    pub fn parse(field: &str, token: &str) -> Result<Self, ValidationError> {
        let invalid = || ValidationError::new(field, "is not a token from a previous response");
        let (micros, id) = token.split_once('.').ok_or_else(invalid)?;
        let micros: i64 = micros.parse().map_err(|_| invalid())?;
        let created_at = DateTime::from_timestamp_micros(micros)
            .filter(|at| is_supported(*at))
            .ok_or_else(invalid)?;
        let id = Uuid::parse_str(id).map_err(|_| invalid())?;
        Ok(Self { created_at, id })
    }

    /// An optional token: empty means the first page.
    pub fn parse_optional(field: &str, token: &str) -> Result<Option<Self>, ValidationError> {
        if token.is_empty() {
            Ok(None)
        } else {
            Self::parse(field, token).map(Some)
        }
    }
}

/// Page tokens of ListAudit: the id of the last event returned (events are listed newest first).
pub fn parse_audit_token(field: &str, token: &str) -> Result<Option<i64>, ValidationError> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .map(Some)
        .ok_or_else(|| ValidationError::new(field, "is not a token from a previous response"))
}

/// Page tokens of GetConversation: the index of the last turn returned.
pub fn parse_turn_token(field: &str, token: &str) -> Result<Option<i32>, ValidationError> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .parse::<i32>()
        .ok()
        .filter(|index| *index >= 0)
        .map(Some)
        .ok_or_else(|| ValidationError::new(field, "is not a token from a previous response"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Item {
        #[prost(string, tag = "1")]
        text: String,
    }

    fn items(sizes: &[usize]) -> Vec<Item> {
        sizes
            .iter()
            .map(|size| Item {
                text: "x".repeat(*size),
            })
            .collect()
    }

    #[test]
    fn a_page_ends_where_its_bytes_would_exceed_the_budget() {
        // Each item encodes as 1 (tag) + 2 (length) + 100 bytes, plus 1 + 1 in the page.
        let page = items(&[100, 100, 100, 100]);
        assert_eq!(fitting_count(&page, 10, 10_000), 4);
        assert_eq!(
            fitting_count(&page, 3, 10_000),
            3,
            "the count still bounds it"
        );
        assert_eq!(fitting_count(&page, 10, 210), 2);
        assert_eq!(fitting_count(&page, 10, 1), 1, "one item always goes");
        assert_eq!(fitting_count(&items(&[]), 10, 1), 0);
    }

    #[test]
    fn entry_tokens_round_trip_and_refuse_what_no_response_holds() {
        let cursor = EntryCursor {
            created_at: DateTime::from_timestamp_micros(1_763_000_000_123_456).unwrap(),
            id: Uuid::from_u128(42),
        };
        assert_eq!(EntryCursor::parse("t", &cursor.token()).unwrap(), cursor);
        let id = Uuid::from_u128(7);
        for garbage in [
            "nonsense".to_owned(),
            "12.not-a-uuid".to_owned(),
            format!("-220000000000000000.{id}"),
            format!("{}.{id}", i64::MAX),
            format!("{}.{id}", i64::MIN),
            format!("253402300800000000.{id}"),
        ] {
            let error = EntryCursor::parse("page_token", &garbage).unwrap_err();
            assert_eq!(error.field, "page_token", "{garbage}");
        }
        assert_eq!(EntryCursor::parse_optional("t", "").unwrap(), None);
    }

    #[test]
    fn audit_tokens_are_positive_ids() {
        assert_eq!(parse_audit_token("t", "").unwrap(), None);
        assert_eq!(parse_audit_token("t", "17").unwrap(), Some(17));
        for garbage in ["0", "-3", "x", "1.5"] {
            assert!(parse_audit_token("t", garbage).is_err(), "{garbage}");
        }
    }
}
