//! The wall clock Core stamps records and events with.

/// Milliseconds since the Unix epoch (0 for a clock before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
