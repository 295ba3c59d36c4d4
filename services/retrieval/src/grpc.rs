//! The gRPC edge of the retrieval service. Every handler does the same four things: authorize the
//! scope, check the request (`proto`), call one operation of [`Retriever`], convert the result
//! (`proto`). A new RPC follows the same shape.

use engram_proto::v1;
use engram_proto::v1::retrieval_service_server::RetrievalService;
use engram_server::authorized_scope;
use tonic::{Request, Response, Status};

use crate::proto;
use crate::service::{ExportStream, Retriever};

#[derive(Debug, Clone)]
pub struct RetrievalApi {
    retriever: Retriever,
}

impl RetrievalApi {
    pub fn new(retriever: Retriever) -> Self {
        Self { retriever }
    }
}

#[tonic::async_trait]
impl RetrievalService for RetrievalApi {
    #[tracing::instrument(skip_all, err(Display))]
    async fn retrieve_memory(
        &self,
        request: Request<v1::RetrieveMemoryRequest>,
    ) -> Result<Response<v1::RetrieveMemoryResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let retrieve = proto::retrieve_memory(scope, request.get_ref(), self.retriever.recall())?;
        let retrieval = self.retriever.retrieve(&retrieve).await?;
        Ok(Response::new(proto::retrieve_response(
            &retrieval, &retrieve,
        )))
    }

    #[tracing::instrument(skip_all, err(Display))]
    async fn context_pre_retrieve(
        &self,
        request: Request<v1::ContextPreRetrieveRequest>,
    ) -> Result<Response<v1::ContextPreRetrieveResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let retrieve =
            proto::context_pre_retrieve(scope, request.get_ref(), self.retriever.recall())?;
        let retrieval = self.retriever.retrieve(&retrieve).await?;
        Ok(Response::new(proto::context_response(
            &retrieval, &retrieve,
        )))
    }

    async fn list_entries(
        &self,
        request: Request<v1::ListEntriesRequest>,
    ) -> Result<Response<v1::ListEntriesResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let (filter, page_size) = proto::list_filter(request.get_ref())?;
        let records = self.retriever.list_entries(&scope, &filter).await?;
        Ok(Response::new(proto::list_response(&records, page_size)))
    }

    #[tracing::instrument(skip_all, err(Display))]
    async fn get_summary(
        &self,
        request: Request<v1::GetSummaryRequest>,
    ) -> Result<Response<v1::GetSummaryResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let summary = self.retriever.summary(&scope).await?;
        Ok(Response::new(proto::summary_response(summary)))
    }

    type ExportSpaceStream = ExportStream;

    async fn export_space(
        &self,
        request: Request<v1::ExportSpaceRequest>,
    ) -> Result<Response<Self::ExportSpaceStream>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let page_size = proto::export_page_size(request.get_ref())?;
        let with_embeddings = request.get_ref().include_embeddings;
        Ok(Response::new(self.retriever.export(
            scope,
            page_size,
            with_embeddings,
        )))
    }
}
