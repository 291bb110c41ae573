//! Caller origins: a web page's, stamped by the browser extension from the
//! browser's own sender information (`https://host[:port]`, loopback
//! `http://…`), or a local program's, which names itself (`app:…`).
//!
//! What a caller may do turns on which of the two it is: a web origin
//! needs the user's consent and is bounded by quotas, a local program runs
//! as the user. One rule, so every place that asks gets the same answer.

/// Whether `origin` is a web page's (`http://` or `https://`), as opposed
/// to a local program's (`app:…`).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::origin::is_web_origin;
///
/// assert!(is_web_origin("https://app.example"));
/// assert!(is_web_origin("http://localhost:8080"));
/// assert!(!is_web_origin("app:my-tool"));
/// // Only the scheme decides, never a look-alike.
/// assert!(!is_web_origin("httpx://app.example"));
/// ```
pub fn is_web_origin(origin: &str) -> bool {
    origin.starts_with("https://") || origin.starts_with("http://")
}
