//! The tonic services: thin adapters from requests to the registry and sessions.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use pedelec_protocol::ErrorCode;
use pedelec_protocol::grpc::error_from_status;
use pedelec_protocol::pb::native_frame::Body;
use pedelec_protocol::pb::native_request::Call;
use pedelec_protocol::pb::native_response::Result as NativeReply;
use pedelec_protocol::pb::{self, agent_tools_server::AgentTools, core_relay_server::CoreRelay, core_server::Core};
use tonic::{Request, Response, Status, Streaming};

use crate::error::CoreError;
use crate::registry::{Registry, check_id};

type RpcReply<T> = Result<Response<T>, Status>;

#[derive(Clone)]
pub struct CoreService {
    pub registry: Arc<Registry>,
}

#[tonic::async_trait]
impl Core for CoreService {
    async fn ping(&self, _: Request<pb::PingRequest>) -> RpcReply<pb::PingResponse> {
        Ok(Response::new(pb::PingResponse { version: env!("CARGO_PKG_VERSION").into(), pid: std::process::id() }))
    }

    async fn list_providers(&self, _: Request<pb::ListProvidersRequest>) -> RpcReply<pb::ListProvidersResponse> {
        // Availability checks stat binaries and probe endpoints: keep them off the async workers.
        let providers = self.registry.shared.providers.now();
        let providers = tokio::task::spawn_blocking(move || providers.list())
            .await
            .map_err(|e| CoreError::new(ErrorCode::Internal, format!("listing providers failed: {e}")))?;
        Ok(Response::new(pb::ListProvidersResponse { providers }))
    }

    async fn get_settings(&self, _: Request<pb::GetSettingsRequest>) -> RpcReply<pb::GetSettingsResponse> {
        let providers = self.registry.shared.providers.now();
        Ok(Response::new(pb::GetSettingsResponse {
            default_provider: providers.default_code(),
            default_models: providers.default_models(),
        }))
    }

    async fn set_settings(&self, request: Request<pb::SetSettingsRequest>) -> RpcReply<pb::GetSettingsResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let change = crate::settings::SettingsChange {
            default_provider: Some(request.default_provider).filter(|d| !d.is_empty()),
            models: request
                .models
                .into_iter()
                .map(|(code, model)| (code, Some(model).filter(|m| !m.is_empty())))
                .collect(),
        };
        let shared = &self.registry.shared;
        crate::settings_file::check(&change, &shared.providers.now())?;
        let Some(path) = shared.config_file.clone() else {
            return Err(CoreError::new(ErrorCode::ConfigInvalid, "this Core runs without a config directory").into());
        };
        // One writer at a time: each change reads the file the last one wrote.
        let _writing = self.registry.settings_writer.lock().await;
        let providers = tokio::task::spawn_blocking(move || crate::settings_file::apply(&path, &change))
            .await
            .map_err(|e| CoreError::new(ErrorCode::Internal, format!("writing the settings failed: {e}")))??;
        tracing::info!(default = %providers.default_code(), "settings changed from the control center");
        let reply = pb::GetSettingsResponse {
            default_provider: providers.default_code(),
            default_models: providers.default_models(),
        };
        shared.providers.replace(providers);
        Ok(Response::new(reply))
    }

    async fn create_session(&self, request: Request<pb::CreateSessionRequest>) -> RpcReply<pb::CreateSessionResponse> {
        let session = self.registry.create(request.into_inner()).await?;
        Ok(Response::new(pb::CreateSessionResponse { session: Some(session) }))
    }

    async fn fork(&self, request: Request<pb::ForkRequest>) -> RpcReply<pb::CreateSessionResponse> {
        let session = self.registry.fork(request.into_inner()).await?;
        Ok(Response::new(pb::CreateSessionResponse { session: Some(session) }))
    }

    type SubscribeStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

    async fn subscribe(&self, request: Request<pb::SubscribeRequest>) -> RpcReply<Self::SubscribeStream> {
        let request = request.into_inner();
        let session = self.registry.get(&request.session_id, &request.caller_origin).await?;
        Ok(Response::new(Box::pin(session.events().map(Ok))))
    }

    async fn prepare(&self, request: Request<pb::PrepareRequest>) -> RpcReply<pb::OperationAccepted> {
        let request = request.into_inner();
        let session = self.registry.get_for_work(&request.session_id, &request.caller_origin).await?;
        Ok(Response::new(session.prepare().await?))
    }

    async fn send_text(&self, request: Request<pb::SendTextRequest>) -> RpcReply<pb::OperationAccepted> {
        let request = request.into_inner();
        let session = self.registry.get_for_work(&request.session_id, &request.caller_origin).await?;
        Ok(Response::new(session.send_text(request.text, request.attachments, &request.output_schema_json).await?))
    }

    async fn submit_tool_result(
        &self,
        request: Request<pb::SubmitToolResultRequest>,
    ) -> RpcReply<pb::SubmitToolResultResponse> {
        let request = request.into_inner();
        let session = self.registry.get(&request.session_id, &request.caller_origin).await?;
        check_id("tool request id", &request.tool_request_id)?;
        session.submit_tool_result(request)?;
        Ok(Response::new(pb::SubmitToolResultResponse {}))
    }

    async fn end(&self, request: Request<pb::EndRequest>) -> RpcReply<pb::EndResponse> {
        let request = request.into_inner();
        let session = self.registry.get(&request.session_id, &request.caller_origin).await?;
        let ended_now = session.end("requested").await?;
        let id = session.id.clone();
        drop(session);
        // Gone from memory at once unless a subscriber (or another request) still holds it.
        self.registry.evict(id.as_str());
        Ok(Response::new(pb::EndResponse { ended_now }))
    }

    async fn resume(&self, request: Request<pb::ResumeRequest>) -> RpcReply<pb::ResumeResponse> {
        let request = request.into_inner();
        let session = self.registry.get_for_work(&request.session_id, &request.caller_origin).await?;
        // The user may have taken the session's agent away from the site.
        self.registry.shared.consent.check_provider(&session.origin, &session.info.provider)?;
        // Resuming an ended session makes it live again: it counts against
        // the origin's quota like a new one (a live one is already counted).
        let _admission = match session.status() {
            pedelec_protocol::SessionStatus::Ended => self.registry.admit(&session.origin)?,
            _ => None,
        };
        session.resume().await?;
        Ok(Response::new(pb::ResumeResponse { session: Some(session.current_info()) }))
    }

    async fn create_asset_upload(&self, request: Request<pb::CreateAssetUploadRequest>) -> RpcReply<pb::AssetTicket> {
        let request = request.into_inner();
        let session = self.usable_for_assets(&request.session_id, &request.caller_origin).await?;
        let assets = &self.registry.shared.assets;
        Ok(Response::new(assets.create_upload(
            session.id.as_str(),
            &session.origin,
            &session.workspace.root,
            &request,
        )?))
    }

    async fn create_asset_download(
        &self,
        request: Request<pb::CreateAssetDownloadRequest>,
    ) -> RpcReply<pb::AssetTicket> {
        let request = request.into_inner();
        let session = self.usable_for_assets(&request.session_id, &request.caller_origin).await?;
        let assets = &self.registry.shared.assets;
        Ok(Response::new(assets.create_download(
            session.id.as_str(),
            &session.origin,
            &session.workspace.root,
            &request.path,
        )?))
    }

    async fn list_assets(&self, request: Request<pb::ListAssetsRequest>) -> RpcReply<pb::ListAssetsResponse> {
        let request = request.into_inner();
        let session = self.usable_for_assets(&request.session_id, &request.caller_origin).await?;
        let workspace = session.workspace.root.clone();
        let assets = tokio::task::spawn_blocking(move || crate::assets::list(&workspace))
            .await
            .map_err(|e| Status::internal(format!("listing failed: {e}")))??;
        Ok(Response::new(pb::ListAssetsResponse { assets }))
    }

    async fn get_history(&self, request: Request<pb::GetHistoryRequest>) -> RpcReply<pb::GetHistoryResponse> {
        let request = request.into_inner();
        let session = self.registry.get(&request.session_id, &request.caller_origin).await?;
        Ok(Response::new(self.history(&session, request.after_seq, request.before_id, request.limit).await?))
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> RpcReply<pb::CancelResponse> {
        let request = request.into_inner();
        let session = self.registry.get(&request.session_id, &request.caller_origin).await?;
        Ok(Response::new(cancel(&session, &request.operation_id).await?))
    }

    async fn steer(&self, request: Request<pb::SteerRequest>) -> RpcReply<pb::SteerResponse> {
        let request = request.into_inner();
        let session = self.registry.get_for_work(&request.session_id, &request.caller_origin).await?;
        let operation = match request.operation_id.as_str() {
            "" => None,
            id => {
                check_id("operation id", id)?;
                Some(pedelec_protocol::OperationId::new(id.to_owned()))
            }
        };
        Ok(Response::new(session.steer(operation, request.text).await?))
    }

    async fn get_changes(&self, request: Request<pb::GetChangesRequest>) -> RpcReply<pb::GetChangesResponse> {
        let request = request.into_inner();
        let session = self.registry.get(&request.session_id, &request.caller_origin).await?;
        if !request.turn_id.is_empty() {
            check_id("turn id", &request.turn_id)?;
        }
        Ok(Response::new(session.get_changes(&request.turn_id).await?))
    }

    async fn set_tools(&self, request: Request<pb::SetToolsRequest>) -> RpcReply<pb::SetToolsResponse> {
        let request = request.into_inner();
        let session = self.registry.get_for_work(&request.session_id, &request.caller_origin).await?;
        session.set_tools(request.tools).await?;
        Ok(Response::new(pb::SetToolsResponse {}))
    }

    async fn set_model(&self, request: Request<pb::SetModelRequest>) -> RpcReply<pb::SetModelResponse> {
        let request = request.into_inner();
        let session = self.registry.get_for_work(&request.session_id, &request.caller_origin).await?;
        let effort = match pb::EffortLevel::try_from(request.effort_level) {
            Ok(pb::EffortLevel::Unspecified) => None,
            Ok(level) => Some(level),
            Err(_) => return Err(CoreError::new(ErrorCode::InvalidArgument, "unknown effort level").into()),
        };
        let info = session.set_model(&request.model, effort)?;
        Ok(Response::new(pb::SetModelResponse { session: Some(info) }))
    }

    async fn answer_permission(
        &self,
        request: Request<pb::AnswerPermissionRequest>,
    ) -> RpcReply<pb::AnswerPermissionResponse> {
        let request = request.into_inner();
        let session = self.registry.get(&request.session_id, &request.caller_origin).await?;
        check_id("permission id", &request.permission_id)?;
        if request.option_id.len() > pedelec_protocol::limits::MAX_ID_LEN {
            return Err(CoreError::new(ErrorCode::InvalidArgument, "option_id is too long").into());
        }
        session.answer_permission(&request.permission_id, &request.option_id)?;
        Ok(Response::new(pb::AnswerPermissionResponse {}))
    }

    async fn list_sessions(&self, request: Request<pb::ListSessionsRequest>) -> RpcReply<pb::ListSessionsResponse> {
        let request = request.into_inner();
        let (sessions, has_more) = self.registry.list(&request).await?;
        Ok(Response::new(pb::ListSessionsResponse { sessions, has_more }))
    }

    async fn get_consent(&self, request: Request<pb::GetConsentRequest>) -> RpcReply<pb::GetConsentResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        Ok(Response::new(pb::GetConsentResponse { origins: self.registry.shared.consent.list(&request.origin) }))
    }

    async fn set_consent(&self, request: Request<pb::SetConsentRequest>) -> RpcReply<pb::SetConsentResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let consent =
            request.consent.ok_or_else(|| CoreError::new(ErrorCode::InvalidArgument, "SetConsent needs a consent"))?;
        Ok(Response::new(pb::SetConsentResponse { consent: Some(self.registry.set_consent(&consent).await?) }))
    }

    async fn revoke_origin(&self, request: Request<pb::RevokeOriginRequest>) -> RpcReply<pb::RevokeOriginResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let sessions_ended = self.registry.revoke_origin(&request.origin).await?;
        Ok(Response::new(pb::RevokeOriginResponse { sessions_ended }))
    }

    async fn list_live_sessions(
        &self,
        request: Request<pb::ListLiveSessionsRequest>,
    ) -> RpcReply<pb::ListLiveSessionsResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let ended_limit = pedelec_protocol::limits::ended_listed(request.ended_limit).ok_or_else(|| {
            CoreError::with_details(
                ErrorCode::InvalidArgument,
                format!("ended_limit is at most {}", pedelec_protocol::limits::MAX_ENDED_LISTED),
                serde_json::json!({ "field": "ended_limit" }),
            )
        })?;
        let ended_limit = request.include_ended.then_some(ended_limit);
        let sessions = self.registry.live_and_ended_sessions(&request.origin, ended_limit).await?;
        Ok(Response::new(pb::ListLiveSessionsResponse { sessions }))
    }

    async fn end_sessions(&self, request: Request<pb::EndSessionsRequest>) -> RpcReply<pb::EndSessionsResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let ended = self.registry.end_sessions(&request.session_ids, &request.origin).await?;
        Ok(Response::new(pb::EndSessionsResponse { ended }))
    }

    type WatchSessionStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

    async fn watch_session(&self, request: Request<pb::WatchSessionRequest>) -> RpcReply<Self::WatchSessionStream> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let session = self.registry.get_as_owner(&request.session_id).await?;
        Ok(Response::new(Box::pin(session.watch().map(Ok))))
    }

    async fn get_session_history(
        &self,
        request: Request<pb::GetSessionHistoryRequest>,
    ) -> RpcReply<pb::GetHistoryResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let session = self.registry.get_as_owner(&request.session_id).await?;
        Ok(Response::new(self.history(&session, request.after_seq, request.before_id, request.limit).await?))
    }

    async fn cancel_turn(&self, request: Request<pb::CancelTurnRequest>) -> RpcReply<pb::CancelResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let session = self.registry.get_as_owner(&request.session_id).await?;
        tracing::info!(session = %session.id, origin = %session.origin, "the user cancels the running turn");
        Ok(Response::new(cancel(&session, &request.operation_id).await?))
    }

    async fn list_agents(&self, request: Request<pb::ListAgentsRequest>) -> RpcReply<pb::ListAgentsResponse> {
        crate::consent::check_owner(&request.into_inner().caller_origin)?;
        // Detection stats programs and may probe a loopback endpoint: off the async workers.
        let providers = self.registry.shared.providers.now();
        let agents = tokio::task::spawn_blocking(move || providers.agents())
            .await
            .map_err(|e| CoreError::new(ErrorCode::Internal, format!("detecting agents failed: {e}")))?;
        Ok(Response::new(agents))
    }

    async fn list_activity(&self, request: Request<pb::ListActivityRequest>) -> RpcReply<pb::ListActivityResponse> {
        use crate::activity_log::{DEFAULT_ACTIVITY_PAGE, MAX_ACTIVITY_PAGE, Query, cursor_of};
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let query =
            Query::check(&request.origin, &request.cursor, request.limit, DEFAULT_ACTIVITY_PAGE, MAX_ACTIVITY_PAGE)?;
        let (entries, has_more) = self.registry.shared.store.activity(query).await?;
        let next_cursor = match (has_more, entries.last()) {
            (true, Some(last)) => cursor_of(last.id),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListActivityResponse { entries, has_more, next_cursor }))
    }

    async fn export_activity(
        &self,
        request: Request<pb::ExportActivityRequest>,
    ) -> RpcReply<pb::ExportActivityResponse> {
        use crate::activity_log::{MAX_ACTIVITY_EXPORT, Query, cursor_of};
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let query =
            Query::check(&request.origin, &request.cursor, request.limit, MAX_ACTIVITY_EXPORT, MAX_ACTIVITY_EXPORT)?;
        let (entries, has_more) = self.registry.shared.store.activity(query).await?;
        let next_cursor = match (has_more, entries.last()) {
            (true, Some(last)) => cursor_of(last.id),
            _ => String::new(),
        };
        let mut jsonl = String::new();
        for entry in &entries {
            jsonl.push_str(&pedelec_protocol::json::to_json(entry));
            jsonl.push('\n');
        }
        Ok(Response::new(pb::ExportActivityResponse { jsonl, entries: entries.len() as u32, has_more, next_cursor }))
    }

    async fn list_folders(&self, request: Request<pb::ListFoldersRequest>) -> RpcReply<pb::ListFoldersResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        Ok(Response::new(self.registry.list_folders(request.path, request.include_hidden).await?))
    }

    async fn pick_folder(&self, request: Request<pb::PickFolderRequest>) -> RpcReply<pb::PickFolderResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        Ok(Response::new(self.registry.pick_folder(&request.origin, &request.path).await?))
    }

    async fn list_user_permissions(
        &self,
        request: Request<pb::ListUserPermissionsRequest>,
    ) -> RpcReply<pb::ListUserPermissionsResponse> {
        crate::consent::check_owner(&request.into_inner().caller_origin)?;
        Ok(Response::new(pb::ListUserPermissionsResponse { permissions: self.registry.user_permissions() }))
    }

    async fn answer_user_permission(
        &self,
        request: Request<pb::AnswerUserPermissionRequest>,
    ) -> RpcReply<pb::AnswerPermissionResponse> {
        let request = request.into_inner();
        crate::consent::check_owner(&request.caller_origin)?;
        let session = self.registry.get_as_owner(&request.session_id).await?;
        check_id("permission id", &request.permission_id)?;
        if request.option_id.len() > pedelec_protocol::limits::MAX_ID_LEN {
            return Err(CoreError::new(ErrorCode::InvalidArgument, "option_id is too long").into());
        }
        session.answer_user_permission(&request.permission_id, &request.option_id)?;
        Ok(Response::new(pb::AnswerPermissionResponse {}))
    }
}

/// Cancels `session`'s operation `operation_id` (empty: the active one).
async fn cancel(session: &Arc<crate::session::Session>, operation_id: &str) -> Result<pb::CancelResponse, CoreError> {
    let operation = match operation_id {
        "" => None,
        id => {
            check_id("operation id", id)?;
            Some(pedelec_protocol::OperationId::new(id.to_owned()))
        }
    };
    session.cancel(operation).await
}

impl CoreService {
    /// One page of `session`'s transcript (`GetHistory`'s rules).
    async fn history(
        &self,
        session: &crate::session::Session,
        after_seq: u64,
        before_id: u64,
        limit: u32,
    ) -> Result<pb::GetHistoryResponse, CoreError> {
        let limit = match limit {
            0 => pedelec_protocol::limits::DEFAULT_HISTORY_PAGE,
            n if n > pedelec_protocol::limits::MAX_HISTORY_PAGE => {
                return Err(CoreError::with_details(
                    ErrorCode::InvalidArgument,
                    format!("a history page holds at most {} entries", pedelec_protocol::limits::MAX_HISTORY_PAGE),
                    serde_json::json!({ "limit": pedelec_protocol::limits::MAX_HISTORY_PAGE }),
                ));
            }
            n => n,
        };
        let query = crate::store::HistoryQuery { after_seq, before_id, limit };
        let (rows, has_more) = self.registry.shared.store.history(&session.id, query).await?;
        let entries = rows.iter().filter_map(|(id, row)| crate::history::entry(*id, row)).collect();
        Ok(pb::GetHistoryResponse { entries, has_more })
    }

    /// Assets are usable while a session is not ending or ended.
    async fn usable_for_assets(&self, id: &str, origin: &str) -> Result<Arc<crate::session::Session>, CoreError> {
        let session = self.registry.get_for_work(id, origin).await?;
        if let Some((code, message)) = session.status().refuse_assets() {
            return Err(CoreError::new(code, message));
        }
        Ok(session)
    }
}

/// Calls one relay stream works on, or has answered but not yet sent, at once.
pub const RELAY_IN_FLIGHT: usize = 256;

impl CoreService {
    /// Answers one relayed call through the same handler its own RPC uses.
    async fn dispatch(&self, call: Call) -> Result<NativeReply, Status> {
        fn r<T>(request: T) -> Request<T> {
            Request::new(request)
        }
        Ok(match call {
            Call::Ping(q) => NativeReply::Ping(self.ping(r(q)).await?.into_inner()),
            Call::ListProviders(q) => NativeReply::ListProviders(self.list_providers(r(q)).await?.into_inner()),
            Call::GetSettings(q) => NativeReply::GetSettings(self.get_settings(r(q)).await?.into_inner()),
            Call::SetSettings(q) => NativeReply::SetSettings(self.set_settings(r(q)).await?.into_inner()),
            Call::CreateSession(q) => NativeReply::CreateSession(self.create_session(r(q)).await?.into_inner()),
            Call::Prepare(q) => NativeReply::Prepare(self.prepare(r(q)).await?.into_inner()),
            Call::SendText(q) => NativeReply::SendText(self.send_text(r(q)).await?.into_inner()),
            Call::SubmitToolResult(q) => {
                NativeReply::SubmitToolResult(self.submit_tool_result(r(q)).await?.into_inner())
            }
            Call::End(q) => NativeReply::End(self.end(r(q)).await?.into_inner()),
            Call::Resume(q) => NativeReply::Resume(self.resume(r(q)).await?.into_inner()),
            Call::CreateAssetUpload(q) => {
                NativeReply::CreateAssetUpload(self.create_asset_upload(r(q)).await?.into_inner())
            }
            Call::CreateAssetDownload(q) => {
                NativeReply::CreateAssetDownload(self.create_asset_download(r(q)).await?.into_inner())
            }
            Call::ListAssets(q) => NativeReply::ListAssets(self.list_assets(r(q)).await?.into_inner()),
            Call::GetHistory(q) => NativeReply::GetHistory(self.get_history(r(q)).await?.into_inner()),
            Call::Cancel(q) => NativeReply::Cancel(self.cancel(r(q)).await?.into_inner()),
            Call::Steer(q) => NativeReply::Steer(self.steer(r(q)).await?.into_inner()),
            Call::GetChanges(q) => NativeReply::GetChanges(self.get_changes(r(q)).await?.into_inner()),
            Call::SetModel(q) => NativeReply::SetModel(self.set_model(r(q)).await?.into_inner()),
            Call::SetTools(q) => NativeReply::SetTools(self.set_tools(r(q)).await?.into_inner()),
            Call::Fork(q) => NativeReply::Fork(self.fork(r(q)).await?.into_inner()),
            Call::ListSessions(q) => NativeReply::ListSessions(self.list_sessions(r(q)).await?.into_inner()),
            Call::AnswerPermission(q) => {
                NativeReply::AnswerPermission(self.answer_permission(r(q)).await?.into_inner())
            }
            Call::GetConsent(q) => NativeReply::GetConsent(self.get_consent(r(q)).await?.into_inner()),
            Call::SetConsent(q) => NativeReply::SetConsent(self.set_consent(r(q)).await?.into_inner()),
            Call::RevokeOrigin(q) => NativeReply::RevokeOrigin(self.revoke_origin(r(q)).await?.into_inner()),
            Call::ListUserPermissions(q) => {
                NativeReply::ListUserPermissions(self.list_user_permissions(r(q)).await?.into_inner())
            }
            Call::AnswerUserPermission(q) => {
                NativeReply::AnswerUserPermission(self.answer_user_permission(r(q)).await?.into_inner())
            }
            Call::ListLiveSessions(q) => {
                NativeReply::ListLiveSessions(self.list_live_sessions(r(q)).await?.into_inner())
            }
            Call::EndSessions(q) => NativeReply::EndSessions(self.end_sessions(r(q)).await?.into_inner()),
            Call::GetSessionHistory(q) => {
                NativeReply::GetSessionHistory(self.get_session_history(r(q)).await?.into_inner())
            }
            Call::CancelTurn(q) => NativeReply::CancelTurn(self.cancel_turn(r(q)).await?.into_inner()),
            Call::ListAgents(q) => NativeReply::ListAgents(self.list_agents(r(q)).await?.into_inner()),
            Call::ListActivity(q) => NativeReply::ListActivity(self.list_activity(r(q)).await?.into_inner()),
            Call::ExportActivity(q) => NativeReply::ExportActivity(self.export_activity(r(q)).await?.into_inner()),
            Call::ListFolders(q) => NativeReply::ListFolders(self.list_folders(r(q)).await?.into_inner()),
            Call::PickFolder(q) => NativeReply::PickFolder(self.pick_folder(r(q)).await?.into_inner()),
            Call::Subscribe(_) | Call::WatchSession(_) | Call::Unsubscribe(_) => {
                return Err(CoreError::new(
                    ErrorCode::InvalidArgument,
                    "subscriptions use Core.Subscribe and Core.WatchSession",
                )
                .into());
            }
        })
    }

    /// One relay frame in, its answer out (same request id).
    async fn answer(&self, frame: pb::NativeFrame) -> pb::NativeFrame {
        let (request_id, call) = match pedelec_protocol::native::request_call(frame) {
            Ok(request) => request,
            Err(refusal) => return *refusal,
        };
        let body = match self.dispatch(call).await {
            Ok(reply) => Body::Response(pb::NativeResponse { result: Some(reply) }),
            Err(status) => Body::Error(error_from_status(&status)),
        };
        pb::NativeFrame { request_id, body: Some(body), ..Default::default() }
    }
}

#[tonic::async_trait]
impl CoreRelay for CoreService {
    type RelayStream = Pin<Box<dyn Stream<Item = Result<pb::NativeFrame, Status>> + Send>>;

    async fn relay(&self, request: Request<Streaming<pb::NativeFrame>>) -> RpcReply<Self::RelayStream> {
        let service = self.clone();
        let mut frames = request.into_inner();
        let (answers, queued) = tokio::sync::mpsc::channel(RELAY_IN_FLIGHT);
        // Each call runs as its own task, so it finishes (and lets go of any
        // session lock) even if the caller stops reading answers; the permits
        // bound the calls at work plus the answers waiting to be read, and
        // reading the stream pauses beyond that. A broken request stream (the
        // host went away) stops the reading; calls already started complete.
        tokio::spawn(async move {
            let permits = Arc::new(tokio::sync::Semaphore::new(RELAY_IN_FLIGHT));
            while let Some(Ok(frame)) = frames.next().await {
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                let (service, answers) = (service.clone(), answers.clone());
                tokio::spawn(async move {
                    let _ = answers.send(service.answer(frame).await).await;
                    drop(permit);
                });
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(queued).map(Ok))))
    }
}

/// The agent-facing service, authenticated by a session's tool token.
#[derive(Clone)]
pub struct AgentToolsService {
    pub registry: Arc<Registry>,
}

#[tonic::async_trait]
impl AgentTools for AgentToolsService {
    async fn list_tools(&self, request: Request<pb::ListToolsRequest>) -> RpcReply<pb::ListToolsResponse> {
        Ok(Response::new(self.list(&request.into_inner().tool_token)?))
    }

    async fn call_tool(&self, request: Request<pb::CallToolRequest>) -> RpcReply<pb::CallToolResponse> {
        Ok(Response::new(self.call(request.into_inner()).await?))
    }

    async fn request_permission(
        &self,
        request: Request<pb::AgentPermissionRequest>,
    ) -> RpcReply<pb::AgentPermissionResponse> {
        Ok(Response::new(self.permission(request.into_inner()).await?))
    }
}

/// The calls themselves, shared by the gRPC service and the tool socket
/// (`crate::tool_socket`): an `Err` is a refusal before the call ran.
impl AgentToolsService {
    pub fn list(&self, tool_token: &str) -> Result<pb::ListToolsResponse, CoreError> {
        let session = self.registry.by_token(tool_token)?;
        Ok(pb::ListToolsResponse { tools: session.tools().definitions.clone(), guidance: session.guidance.clone() })
    }

    pub async fn call(&self, request: pb::CallToolRequest) -> Result<pb::CallToolResponse, CoreError> {
        use pb::call_tool_response::Outcome;
        let session = self.registry.by_token(&request.tool_token)?;
        let outcome = match session.call_tool(None, &request.tool, request.args_json).await {
            Ok(json) => Outcome::ResultJson(json),
            Err(error) => Outcome::Error(error),
        };
        Ok(pb::CallToolResponse { outcome: Some(outcome) })
    }

    pub async fn permission(
        &self,
        request: pb::AgentPermissionRequest,
    ) -> Result<pb::AgentPermissionResponse, CoreError> {
        let session = self.registry.by_token(&request.tool_token)?;
        let mode = pb::PermissionMode::try_from(session.info.permission_mode).unwrap_or_default();
        Ok(crate::providers::claude::ask_permission(&*session.asker(), mode, &request.tool, &request.input_json).await)
    }
}

impl From<pb::Error> for CoreError {
    fn from(error: pb::Error) -> Self {
        let code = error.error_code().unwrap_or(pedelec_protocol::ErrorCode::Internal);
        CoreError::new(code, error.message)
    }
}
