//! The gRPC edge of the review service. Every handler does the same four things: authorize the
//! scope, check the request (`proto`), call one operation of [`Reviewer`], convert the result
//! (`proto`). A new RPC follows the same shape.

use engram_proto::v1;
use engram_proto::v1::review_service_server::ReviewService;
use engram_server::authorized_scope;
use tonic::{Request, Response, Status};

use crate::proto;
use crate::service::Reviewer;

#[derive(Debug, Clone)]
pub struct ReviewApi {
    reviewer: Reviewer,
}

impl ReviewApi {
    pub fn new(reviewer: Reviewer) -> Self {
        Self { reviewer }
    }
}

#[tonic::async_trait]
impl ReviewService for ReviewApi {
    async fn get_memory_state(
        &self,
        request: Request<v1::GetMemoryStateRequest>,
    ) -> Result<Response<v1::GetMemoryStateResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let memory_id = proto::memory_id(request.get_ref())?;
        let state = self.reviewer.memory_state(&scope, memory_id).await?;
        Ok(Response::new(proto::memory_state_response(state)))
    }

    async fn grade_memories(
        &self,
        request: Request<v1::GradeMemoriesRequest>,
    ) -> Result<Response<v1::GradeMemoriesResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let grading = proto::grading_request(request.get_ref())?;
        let outcomes = self.reviewer.grade(&scope, &grading).await?;
        Ok(Response::new(proto::grading_response(outcomes)))
    }

    async fn get_review_stats(
        &self,
        request: Request<v1::GetReviewStatsRequest>,
    ) -> Result<Response<v1::GetReviewStatsResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let (since, until) = proto::stats_period(request.get_ref())?;
        let stats = self.reviewer.stats(&scope, since, until).await?;
        Ok(Response::new(proto::stats_response(&stats)))
    }
}
