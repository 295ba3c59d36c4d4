//! The gRPC edge of the retrieval service.

use chrono::{DateTime, Utc};
use engram_core::ValidationError;
use engram_core::validate::parse_page_size;
use engram_proto::v1;
use engram_proto::v1::retrieval_service_server::RetrievalService;
use engram_server::AccessGrant;
use engram_server::convert::{memory_to_proto, scope_from_proto};
use engram_store::memories::{self, ListFilter};
use sqlx::PgPool;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::error::RetrievalError;

const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 500;

#[derive(Debug, Clone)]
pub struct RetrievalApi {
    pool: PgPool,
}

impl RetrievalApi {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

/// Page tokens are `<created_at micros>.<id>` of the last entry returned: opaque to clients,
/// stable under concurrent inserts (keyset paging).
fn encode_page_token(created_at: DateTime<Utc>, id: Uuid) -> String {
    format!("{}.{}", created_at.timestamp_micros(), id)
}

fn decode_page_token(token: &str) -> Result<(DateTime<Utc>, Uuid), ValidationError> {
    let invalid = || ValidationError::new("page_token", "is not a token from a previous response");
    let (micros, id) = token.split_once('.').ok_or_else(invalid)?;
    let micros: i64 = micros.parse().map_err(|_| invalid())?;
    let created_at = DateTime::from_timestamp_micros(micros).ok_or_else(invalid)?;
    let id = Uuid::parse_str(id).map_err(|_| invalid())?;
    Ok((created_at, id))
}

fn kind_filter(raw: i32) -> Result<Option<&'static str>, ValidationError> {
    match v1::MemoryKind::try_from(raw) {
        Ok(v1::MemoryKind::Unspecified) => Ok(None),
        Ok(v1::MemoryKind::Semantic) => Ok(Some("semantic")),
        Ok(v1::MemoryKind::Episodic) => Ok(Some("episodic")),
        Err(_) => Err(ValidationError::new(
            "kind",
            format!("{raw} is not a known memory kind"),
        )),
    }
}

#[tonic::async_trait]
impl RetrievalService for RetrievalApi {
    async fn list_entries(
        &self,
        request: Request<v1::ListEntriesRequest>,
    ) -> Result<Response<v1::ListEntriesResponse>, Status> {
        let grant = AccessGrant::of_request(&request)?;
        let message = request.into_inner();
        let scope = scope_from_proto(message.scope).map_err(RetrievalError::from)?;
        grant.authorize(&scope)?;
        let page_size = parse_page_size(
            "page_size",
            message.page_size,
            DEFAULT_PAGE_SIZE,
            MAX_PAGE_SIZE,
        )
        .map_err(RetrievalError::from)?;
        let after = if message.page_token.is_empty() {
            None
        } else {
            Some(decode_page_token(&message.page_token).map_err(RetrievalError::from)?)
        };
        let filter = ListFilter {
            pinned: message.pinned,
            manually_saved: message.manually_saved,
            kind: kind_filter(message.kind).map_err(RetrievalError::from)?,
            after,
            limit: i64::from(page_size) + 1,
        };
        let mut records = memories::list(&self.pool, &scope, &filter)
            .await
            .map_err(RetrievalError::from)?;
        let has_more = records.len() > page_size as usize;
        records.truncate(page_size as usize);
        let next_page_token = match records.last() {
            Some(last) if has_more => encode_page_token(last.created_at, last.id),
            _ => String::new(),
        };
        Ok(Response::new(v1::ListEntriesResponse {
            entries: records.iter().map(memory_to_proto).collect(),
            next_page_token,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let created_at = DateTime::from_timestamp_micros(1_763_000_000_123_456).unwrap();
        let id = Uuid::from_u128(42);
        assert_eq!(
            decode_page_token(&encode_page_token(created_at, id)).unwrap(),
            (created_at, id)
        );
        assert!(decode_page_token("nonsense").is_err());
        assert!(decode_page_token("12.not-a-uuid").is_err());
    }
}
