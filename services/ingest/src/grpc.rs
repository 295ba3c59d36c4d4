//! The gRPC edge of the ingest service. Every handler does the same four things: authorize the
//! scope, check the request (`proto`), call one operation of [`Ingest`], convert the result
//! (`proto`). A new RPC follows the same shape.

use engram_proto::v1;
use engram_proto::v1::ingest_service_server::IngestService;
use engram_server::convert::memory_to_proto;
use engram_server::{AccessGrant, authorized_scope};
use tonic::{Request, Response, Status};

use crate::proto;
use crate::service::Ingest;

/// The `engram.v1.IngestService` implementation.
#[derive(Debug, Clone)]
pub struct IngestApi {
    ingest: Ingest,
}

impl IngestApi {
    pub fn new(ingest: Ingest) -> Self {
        Self { ingest }
    }
}

#[tonic::async_trait]
impl IngestService for IngestApi {
    async fn remember(
        &self,
        request: Request<v1::RememberRequest>,
    ) -> Result<Response<v1::RememberResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let max_text_chars = self.ingest.max_text_chars();
        let command = proto::remember_command(scope, request.get_ref(), max_text_chars)?;
        let result = self.ingest.remember(command).await?;
        Ok(Response::new(proto::remember_to_proto(result)))
    }

    async fn forget(
        &self,
        request: Request<v1::ForgetRequest>,
    ) -> Result<Response<v1::ForgetResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let memory = proto::memory_id(&request.get_ref().memory_id)?;
        let forgotten = self.ingest.forget(&scope, memory).await?;
        Ok(Response::new(proto::forget_response(&forgotten)))
    }

    async fn pin(
        &self,
        request: Request<v1::PinRequest>,
    ) -> Result<Response<v1::PinResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let memory = proto::memory_id(&request.get_ref().memory_id)?;
        let record = self.ingest.set_pinned(&scope, memory, true).await?;
        let memory = Some(memory_to_proto(&record));
        Ok(Response::new(v1::PinResponse { memory }))
    }

    async fn unpin(
        &self,
        request: Request<v1::UnpinRequest>,
    ) -> Result<Response<v1::UnpinResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let memory = proto::memory_id(&request.get_ref().memory_id)?;
        let record = self.ingest.set_pinned(&scope, memory, false).await?;
        let memory = Some(memory_to_proto(&record));
        Ok(Response::new(v1::UnpinResponse { memory }))
    }

    async fn get_settings(
        &self,
        request: Request<v1::GetSettingsRequest>,
    ) -> Result<Response<v1::GetSettingsResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let settings = self.ingest.settings(&scope).await?;
        let settings = Some(proto::settings_to_proto(settings));
        Ok(Response::new(v1::GetSettingsResponse { settings }))
    }

    async fn update_settings(
        &self,
        request: Request<v1::UpdateSettingsRequest>,
    ) -> Result<Response<v1::UpdateSettingsResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let patch = proto::settings_patch(request.get_ref())?;
        let settings = self.ingest.update_settings(&scope, patch).await?;
        let settings = Some(proto::settings_to_proto(settings));
        Ok(Response::new(v1::UpdateSettingsResponse { settings }))
    }

    async fn start_incognito(
        &self,
        request: Request<v1::StartIncognitoRequest>,
    ) -> Result<Response<v1::StartIncognitoResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let conversation = proto::conversation_id(&request.get_ref().conversation_id)?;
        self.ingest
            .set_incognito(&scope, conversation, true)
            .await?;
        let conversation_id = conversation.to_string();
        Ok(Response::new(v1::StartIncognitoResponse {
            conversation_id,
            incognito: true,
        }))
    }

    async fn end_incognito(
        &self,
        request: Request<v1::EndIncognitoRequest>,
    ) -> Result<Response<v1::EndIncognitoResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let conversation = proto::conversation_id(&request.get_ref().conversation_id)?;
        self.ingest
            .set_incognito(&scope, conversation, false)
            .await?;
        let conversation_id = conversation.to_string();
        Ok(Response::new(v1::EndIncognitoResponse {
            conversation_id,
            incognito: false,
        }))
    }

    async fn apply_command(
        &self,
        request: Request<v1::ApplyCommandRequest>,
    ) -> Result<Response<v1::ApplyCommandResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let max_text_chars = self.ingest.max_text_chars();
        let (conversation, text) = proto::command_request(request.get_ref(), max_text_chars)?;
        let outcome = self
            .ingest
            .apply_command(&scope, conversation, text.as_str());
        Ok(Response::new(proto::command_to_proto(outcome.await?)))
    }

    async fn list_audit(
        &self,
        request: Request<v1::ListAuditRequest>,
    ) -> Result<Response<v1::ListAuditResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let (page_size, before_id) = proto::audit_page_request(request.get_ref())?;
        let records = self.ingest.audit_page(&scope, before_id, page_size + 1);
        Ok(Response::new(proto::audit_response(
            records.await?,
            page_size,
        )))
    }

    async fn import_memories(
        &self,
        request: Request<v1::ImportMemoriesRequest>,
    ) -> Result<Response<v1::ImportMemoriesResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let limits = self.ingest.import_limits().await?;
        let batch = proto::import_batch(&scope, request.into_inner(), limits).await?;
        let imported = self.ingest.import(&scope, batch).await?;
        Ok(Response::new(proto::import_response(imported)))
    }

    async fn reembed(
        &self,
        request: Request<v1::ReembedRequest>,
    ) -> Result<Response<v1::ReembedResponse>, Status> {
        let grant = AccessGrant::of_request(&request)?;
        let scope = proto::reembed_scope(&grant, request.get_ref())?;
        let only_other_models = request.get_ref().only_other_models;
        let (queued, model) = self
            .ingest
            .reembed(scope.as_ref(), only_other_models)
            .await?;
        Ok(Response::new(v1::ReembedResponse { queued, model }))
    }

    async fn append_messages(
        &self,
        request: Request<v1::AppendMessagesRequest>,
    ) -> Result<Response<v1::AppendMessagesResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let conversation = proto::conversation_id(&request.get_ref().conversation_id)?;
        let close = request.get_ref().close_segment;
        let max_text_chars = self.ingest.max_text_chars();
        let messages = proto::new_messages(request.into_inner(), max_text_chars).await?;
        let appended = self
            .ingest
            .append_messages(&scope, conversation, messages, close);
        Ok(Response::new(proto::append_response(appended.await?)))
    }

    async fn close_segment(
        &self,
        request: Request<v1::CloseSegmentRequest>,
    ) -> Result<Response<v1::CloseSegmentResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let conversation = proto::conversation_id(&request.get_ref().conversation_id)?;
        let open = self.ingest.close_segment(&scope, conversation).await?;
        Ok(Response::new(proto::close_segment_response(open)))
    }

    async fn get_conversation(
        &self,
        request: Request<v1::GetConversationRequest>,
    ) -> Result<Response<v1::GetConversationResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let (conversation, page_size, after) = proto::conversation_page_request(request.get_ref())?;
        let page = self
            .ingest
            .conversation_page(&scope, conversation, after, page_size + 1);
        let response = proto::conversation_response(conversation, &page.await?, page_size);
        Ok(Response::new(response))
    }

    async fn forget_conversation(
        &self,
        request: Request<v1::ForgetConversationRequest>,
    ) -> Result<Response<v1::ForgetConversationResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let conversation = proto::conversation_id(&request.get_ref().conversation_id)?;
        let receipt = self
            .ingest
            .forget_conversation(&scope, conversation)
            .await?;
        let response = proto::forget_conversation_response(conversation, &receipt);
        Ok(Response::new(response))
    }

    async fn preview_retention(
        &self,
        request: Request<v1::PreviewRetentionRequest>,
    ) -> Result<Response<v1::PreviewRetentionResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let page_size = proto::preview_page_size(request.get_ref())?;
        let preview = self.ingest.preview_retention(&scope, page_size).await?;
        Ok(Response::new(proto::preview_response(&preview)))
    }
}
