//! Which page of a session's transcript a `GetHistory` asks for, as Core's
//! store and the SDK both name it.

/// A page of a session's transcript (`Core.GetHistory`): the newest `limit`
/// entries with seq > `after_seq` and id < `before_id`, oldest first.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::history::HistoryQuery;
///
/// // The newest 100 entries: every bound left at 0.
/// let newest = HistoryQuery::default();
/// assert_eq!((newest.after_seq, newest.before_id, newest.limit), (0, 0, 0));
/// // What a re-synchronised view missed after the last seq it handled.
/// let missed = HistoryQuery { after_seq: 41, ..Default::default() };
/// assert_eq!(missed.limit, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Only entries with seq > this (0: from the start).
    pub after_seq: u64,
    /// Only entries with id < this (0: up to the newest).
    pub before_id: u64,
    /// Entries per page (0: [`crate::limits::DEFAULT_HISTORY_PAGE`]; at most
    /// [`crate::limits::MAX_HISTORY_PAGE`]).
    pub limit: u32,
}
