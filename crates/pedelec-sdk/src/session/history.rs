//! Reading the session's transcript a page at a time.

use pedelec_protocol::pb;

use super::{HistoryQuery, PedelecSession};
use crate::error::PedelecError;
use crate::tool::ToolName;
use crate::transport::{Call, Reply, unexpected};

impl<T: ToolName> PedelecSession<T> {
    /// A page of the session's transcript (`Core.GetHistory`): the newest
    /// `query.limit` entries (0: 100) with seq > `after_seq` and id <
    /// `before_id` (0: no bound), oldest first, and whether older ones
    /// match too. Page back with `before_id` = the first entry's id; after a
    /// re-sync, `after_seq` = the last seq handled recovers what was missed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::HistoryQuery;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// session.send_text("Hello").await?;
    /// let page = session.history(HistoryQuery { limit: 50, ..Default::default() }).await?;
    /// for entry in &page.entries {
    ///     println!("#{} {:?}", entry.seq, entry.kind);
    /// }
    /// // Older entries, one page further back.
    /// if let (true, Some(first)) = (page.has_more, page.entries.first()) {
    ///     let older = session.history(HistoryQuery { before_id: first.id, ..Default::default() }).await?;
    ///     println!("{} older entries", older.entries.len());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn history(&self, query: HistoryQuery) -> Result<pb::GetHistoryResponse, PedelecError> {
        let request = pb::GetHistoryRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            after_seq: query.after_seq,
            before_id: query.before_id,
            limit: query.limit,
        };
        match self.shell.transport.call(Call::GetHistory(request)).await? {
            Reply::GetHistory(page) => Ok(page),
            other => Err(unexpected(&other)),
        }
    }

    /// The files a turn created, modified or deleted in the session's
    /// workspace, each with a unified diff where one can be shown
    /// (`Core.GetChanges`): `turn_id` `None` is the running turn (its
    /// changes so far, `in_progress`) or else the last finished one. Core
    /// computes it for every agent from a snapshot taken at the turn's start;
    /// secret-looking files are listed without content, binary ones without
    /// a diff. `CHANGES_NOT_FOUND` when none are recorded for that turn.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// session.send_text("Fix the failing test.").await?;
    /// for file in session.changes(None).await?.files {
    ///     println!("{} ({:?})\n{}", file.path, file.kind(), file.diff);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn changes(&self, turn_id: Option<&str>) -> Result<pb::GetChangesResponse, PedelecError> {
        let request = pb::GetChangesRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            turn_id: turn_id.unwrap_or_default().to_owned(),
        };
        match self.shell.transport.call(Call::GetChanges(request)).await? {
            Reply::GetChanges(changes) => Ok(changes),
            other => Err(unexpected(&other)),
        }
    }
}
