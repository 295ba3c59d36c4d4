//! The gRPC edge of the review service.

use chrono::Utc;
use engram_core::MemoryId;
use engram_core::memory_state::{days_since, retrievability};
use engram_proto::v1;
use engram_proto::v1::review_service_server::ReviewService;
use engram_server::authorized_scope;
use engram_server::time::to_proto;
use engram_store::memories;
use sqlx::PgPool;
use tonic::{Request, Response, Status};

use crate::error::ReviewError;

#[derive(Debug, Clone)]
pub struct ReviewApi {
    pool: PgPool,
}

impl ReviewApi {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

#[tonic::async_trait]
impl ReviewService for ReviewApi {
    async fn get_memory_state(
        &self,
        request: Request<v1::GetMemoryStateRequest>,
    ) -> Result<Response<v1::GetMemoryStateResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let message = request.into_inner();
        let memory_id =
            MemoryId::parse("memory_id", &message.memory_id).map_err(ReviewError::from)?;

        let mut connection = self
            .pool
            .acquire()
            .await
            .map_err(|e| ReviewError::Store(e.into()))?;
        let record = memories::get(&mut connection, &scope, memory_id.as_uuid())
            .await
            .map_err(ReviewError::from)?
            .ok_or_else(|| {
                ReviewError::NotFound(format!(
                    "no memory {memory_id} in space {:?} of this user",
                    scope.space.as_str()
                ))
            })?;
        let (Some(stability), Some(difficulty), Some(last_reviewed_at)) =
            (record.stability, record.difficulty, record.last_reviewed_at)
        else {
            return Err(ReviewError::FailedPrecondition(format!(
                "memory {memory_id} is a {} memory; FSRS state belongs to episodic memories only",
                record.kind
            ))
            .into());
        };
        let now = Utc::now();
        let days = days_since(last_reviewed_at, now);
        Ok(Response::new(v1::GetMemoryStateResponse {
            memory_id: record.id.to_string(),
            fsrs: Some(v1::FsrsState {
                stability,
                difficulty,
                last_reviewed_at: Some(to_proto(last_reviewed_at)),
            }),
            retrievability: retrievability(stability, difficulty, days),
            days_since_review: days,
            computed_at: Some(to_proto(now)),
        }))
    }
}
