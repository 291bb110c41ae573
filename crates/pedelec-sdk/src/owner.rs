//! The user's own calls: every origin's live sessions, ending or cancelling
//! any of them, reading any session's history, the requests only the user
//! answers, consent, the folder picker, the agents Core detects and the activity log. They reach past every
//! origin's boundary, so a program gets them only by asking explicitly
//! ([`Pedelec::owner`]) — a tray app, a CLI acting for the user — never by
//! default. Core refuses them from a web origin whatever the SDK does.

use std::sync::Arc;

use pedelec_protocol::{ErrorCode, pb};

use crate::client::Pedelec;
use crate::error::PedelecError;
use crate::session::HistoryQuery;
use crate::transport::{Call, Reply, Transport, unexpected};

/// The owner calls of one client (see the module docs).
#[derive(Clone)]
pub struct Owner {
    transport: Arc<dyn Transport>,
    origin: String,
}

impl Pedelec {
    /// The user's own calls, for a program that acts as the user. Explicit
    /// because they reach every origin's sessions and the user's decisions.
    /// `ORIGIN_NOT_ALLOWED` for a client acting for a web origin (or none):
    /// a page is never the user.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let owner = Pedelec::discover("app:my-tray").await?.owner()?;
    /// for live in owner.live_sessions(None).await? {
    ///     let info = live.summary.and_then(|s| s.session).unwrap_or_default();
    ///     println!("{} runs {} in {}", live.origin, info.provider, live.workspace_path);
    /// }
    /// owner.end_sessions(&[], Some("https://unwanted.example")).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn owner(&self) -> Result<Owner, PedelecError> {
        let origin = self.origin();
        if origin.is_empty() || pedelec_protocol::origin::is_web_origin(origin) {
            return Err(PedelecError::new(
                ErrorCode::OriginNotAllowed,
                format!("{origin:?} is not the user: owner calls need an `app:` origin"),
            ));
        }
        Ok(Owner { transport: self.transport.clone(), origin: origin.to_owned() })
    }
}

impl Owner {
    async fn call(&self, call: Call) -> Result<Reply, PedelecError> {
        self.transport.call(call).await
    }

    /// Every origin's live sessions (`origin` `Some`: that origin's only),
    /// with their real workspace paths and tokens used.
    pub async fn live_sessions(&self, origin: Option<&str>) -> Result<Vec<pb::LiveSession>, PedelecError> {
        let request = pb::ListLiveSessionsRequest {
            caller_origin: self.origin.clone(),
            origin: origin.unwrap_or_default().to_owned(),
            ..Default::default()
        };
        match self.call(Call::ListLiveSessions(request)).await? {
            Reply::ListLiveSessions(r) => Ok(r.sessions),
            other => Err(unexpected(&other)),
        }
    }

    /// [`live_sessions`](Self::live_sessions), then the `ended_limit` most
    /// recently ended sessions (0: 50; at most 1000), newest ended first:
    /// what the control center's Sessions view lists as Recent. Tell them
    /// apart by `summary.status`.
    pub async fn live_and_ended_sessions(
        &self,
        origin: Option<&str>,
        ended_limit: u32,
    ) -> Result<Vec<pb::LiveSession>, PedelecError> {
        let request = pb::ListLiveSessionsRequest {
            caller_origin: self.origin.clone(),
            origin: origin.unwrap_or_default().to_owned(),
            include_ended: true,
            ended_limit,
        };
        match self.call(Call::ListLiveSessions(request)).await? {
            Reply::ListLiveSessions(r) => Ok(r.sessions),
            other => Err(unexpected(&other)),
        }
    }

    /// Ends the sessions `session_ids` (any origin's) and every live session
    /// of `origin`; consent is untouched. The number ended.
    pub async fn end_sessions(&self, session_ids: &[String], origin: Option<&str>) -> Result<u32, PedelecError> {
        let request = pb::EndSessionsRequest {
            caller_origin: self.origin.clone(),
            session_ids: session_ids.to_vec(),
            origin: origin.unwrap_or_default().to_owned(),
        };
        match self.call(Call::EndSessions(request)).await? {
            Reply::EndSessions(r) => Ok(r.ended),
            other => Err(unexpected(&other)),
        }
    }

    /// Stops any session's running turn (as `cancel()` does for its own origin).
    pub async fn cancel_turn(&self, session_id: &str) -> Result<pb::CancelResponse, PedelecError> {
        let request = pb::CancelTurnRequest {
            caller_origin: self.origin.clone(),
            session_id: session_id.to_owned(),
            operation_id: String::new(),
        };
        match self.call(Call::CancelTurn(request)).await? {
            Reply::CancelTurn(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// A page of any session's history (as `PedelecSession::history`).
    pub async fn session_history(
        &self,
        session_id: &str,
        query: HistoryQuery,
    ) -> Result<pb::GetHistoryResponse, PedelecError> {
        let request = pb::GetSessionHistoryRequest {
            caller_origin: self.origin.clone(),
            session_id: session_id.to_owned(),
            after_seq: query.after_seq,
            before_id: query.before_id,
            limit: query.limit,
        };
        match self.call(Call::GetSessionHistory(request)).await? {
            Reply::GetSessionHistory(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// The permission requests only the user may answer.
    pub async fn user_permissions(&self) -> Result<Vec<pb::UserPermission>, PedelecError> {
        let request = pb::ListUserPermissionsRequest { caller_origin: self.origin.clone() };
        match self.call(Call::ListUserPermissions(request)).await? {
            Reply::ListUserPermissions(r) => Ok(r.permissions),
            other => Err(unexpected(&other)),
        }
    }

    /// Answers one of them with one of its options (empty `option_id` rejects).
    pub async fn answer_user_permission(
        &self,
        session_id: &str,
        permission_id: &str,
        option_id: &str,
    ) -> Result<(), PedelecError> {
        let request = pb::AnswerUserPermissionRequest {
            caller_origin: self.origin.clone(),
            session_id: session_id.to_owned(),
            permission_id: permission_id.to_owned(),
            option_id: option_id.to_owned(),
        };
        match self.call(Call::AnswerUserPermission(request)).await? {
            Reply::AnswerUserPermission(_) => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Changes the default provider (when `default_provider` is given) and
    /// providers' default models (an empty model removes the setting) in
    /// Core's config.toml, keeping the file's other lines and comments
    /// (Core's `SetSettings`); effective at once for new sessions. Answers
    /// the settings as they now stand. `PROVIDER_NOT_FOUND`,
    /// `INVALID_ARGUMENT` or `CONFIG_INVALID` change nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let owner = Pedelec::discover("app:my-tray").await?.owner()?;
    /// let models = [("codex".to_owned(), "gpt-5.4".to_owned())].into();
    /// let settings = owner.set_settings(Some("codex"), models).await?;
    /// assert_eq!(settings.default_provider, "codex");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_settings(
        &self,
        default_provider: Option<&str>,
        models: std::collections::HashMap<String, String>,
    ) -> Result<pb::GetSettingsResponse, PedelecError> {
        let request = pb::SetSettingsRequest {
            caller_origin: self.origin.clone(),
            default_provider: default_provider.unwrap_or_default().to_owned(),
            models,
        };
        match self.call(Call::SetSettings(request)).await? {
            Reply::SetSettings(settings) => Ok(settings),
            other => Err(unexpected(&other)),
        }
    }

    /// A page of the activity log (Core's `ListActivity`): what sessions
    /// did — started, ended, commands run, files edited, frontend tools
    /// called, permissions answered — newest first. `origin` keeps one
    /// site's; `cursor` is empty for the newest page, else the previous
    /// page's `next_cursor`; `limit` 0 means 100, at most 1000
    /// (`INVALID_ARGUMENT` beyond, as for a cursor Core never handed out).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let owner = Pedelec::discover("app:my-tray").await?.owner()?;
    /// let mut cursor = String::new();
    /// loop {
    ///     let page = owner.activity(Some("https://app.example"), &cursor, 100).await?;
    ///     for entry in &page.entries {
    ///         println!("{} {} {}", entry.at_ms, entry.session_id, entry.summary);
    ///     }
    ///     if !page.has_more {
    ///         break;
    ///     }
    ///     cursor = page.next_cursor;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn activity(
        &self,
        origin: Option<&str>,
        cursor: &str,
        limit: u32,
    ) -> Result<pb::ListActivityResponse, PedelecError> {
        let request = pb::ListActivityRequest {
            caller_origin: self.origin.clone(),
            origin: origin.unwrap_or_default().to_owned(),
            cursor: cursor.to_owned(),
            limit,
        };
        match self.call(Call::ListActivity(request)).await? {
            Reply::ListActivity(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// Part of the activity log as JSON lines (Core's `ExportActivity`):
    /// the entries `activity` pages through, one canonical JSON object per
    /// line, at most 5000 per part (`limit` 0: 5000). Page on with
    /// `next_cursor` while `has_more`.
    pub async fn export_activity(
        &self,
        origin: Option<&str>,
        cursor: &str,
        limit: u32,
    ) -> Result<pb::ExportActivityResponse, PedelecError> {
        let request = pb::ExportActivityRequest {
            caller_origin: self.origin.clone(),
            origin: origin.unwrap_or_default().to_owned(),
            cursor: cursor.to_owned(),
            limit,
        };
        match self.call(Call::ExportActivity(request)).await? {
            Reply::ExportActivity(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// The sub-folders of `path` for a folder picker (Core's
    /// `ListFolders`; empty `path`: the user's home directory): names
    /// only, sorted, at most 1000, each marked whether it may be picked;
    /// links are listed as links and never followed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let owner = Pedelec::discover("app:my-tray").await?.owner()?;
    /// let home = owner.list_folders("", false).await?;
    /// for folder in home.folders.iter().filter(|f| f.pickable) {
    ///     println!("{}/{}", home.path, folder.name);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn list_folders(
        &self,
        path: &str,
        include_hidden: bool,
    ) -> Result<pb::ListFoldersResponse, PedelecError> {
        let request =
            pb::ListFoldersRequest { caller_origin: self.origin.clone(), path: path.to_owned(), include_hidden };
        match self.call(Call::ListFolders(request)).await? {
            Reply::ListFolders(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// The user picked `path` for the web origin `origin` (Core's
    /// `PickFolder`): Core grants it and answers an opaque workspace
    /// handle, good for that origin only (`SessionOptions::workspace_handle`
    /// or a page's `createSession({ workspace: { handle } })`), and the
    /// folder's name.
    pub async fn pick_folder(&self, origin: &str, path: &str) -> Result<pb::PickFolderResponse, PedelecError> {
        let request = pb::PickFolderRequest {
            caller_origin: self.origin.clone(),
            origin: origin.to_owned(),
            path: path.to_owned(),
        };
        match self.call(Call::PickFolder(request)).await? {
            Reply::PickFolder(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// The agents Core detects, as `pedelec-core doctor` lists them.
    pub async fn agents(&self) -> Result<pb::ListAgentsResponse, PedelecError> {
        let request = pb::ListAgentsRequest { caller_origin: self.origin.clone() };
        match self.call(Call::ListAgents(request)).await? {
            Reply::ListAgents(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }
}
