//! Token usage: a cumulative total that only grows.

/// Whether a reported cumulative `total` is news given the `known` one:
/// usage is monotonic, so a lower or equal total (a provider re-reporting,
/// or a snapshot older than an update) changes nothing and is not announced.
///
/// ```
/// use pedelec_protocol::usage::grows;
/// assert!(grows(None, 0));
/// assert!(grows(Some(10), 11));
/// assert!(!grows(Some(10), 10));
/// assert!(!grows(Some(10), 3));
/// ```
pub fn grows(known: Option<u64>, total: u64) -> bool {
    known.is_none_or(|known| total > known)
}
