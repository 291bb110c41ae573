//! Token usage: a cumulative total that only grows.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::usage::grows;
//!
//! // Only totals above the known one are announced.
//! let mut known = None;
//! for total in [10, 10, 7, 25] {
//!     if grows(known, total) {
//!         known = Some(total);
//!     }
//! }
//! assert_eq!(known, Some(25));
//! ```

/// Whether a reported cumulative `total` is news given the `known` one:
/// usage is monotonic, so a lower or equal total (a provider re-reporting,
/// or a snapshot older than an update) changes nothing and is not announced.
///
/// # Examples
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
