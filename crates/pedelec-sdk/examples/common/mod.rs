//! What the bench examples share: Core's memory figures from `/proc`, and
//! the in-process floor of a tool call.

#![allow(dead_code)] // each example uses its own part

/// A `VmRSS`/`VmHWM`-style figure from `/proc/<pid>/status`, in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The anonymous part of RSS (heap, stacks): what sessions allocate, without
/// the binary's own pages that first use of a code path brings in.
pub fn rss_anon_kib(pid: u32) -> u64 {
    status_kib(pid, "RssAnon:")
}

pub fn hwm_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The p50 in µs that a scripted `/tools N NAME JSON` reply reports
/// ("… round trip p50=123us …"), or that an ACP test agent's reply reports
/// ("… p50 123 µs …").
pub fn reported_p50_us(reply: &str) -> Option<f64> {
    let rest = reply.split_once("p50=").or_else(|| reply.split_once("p50 "))?.1;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The in-process floor of a frontend tool call, on `session` (scripted,
/// with the echo tool `t`): 1 000 calls agent → SDK handler → agent inside
/// Core, p50 in µs. Measured beside a real path's figure in the same run.
pub async fn scripted_tool_floor_us(
    session: &pedelec_sdk::PedelecSession<String>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let reply = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let r = reply.clone();
    let _chat = session.on_chat(move |text, _| *r.lock().unwrap() = text.to_string());
    session.send_text("/tools 1000 t {\"n\": 1}").await?;
    let text = reply.lock().unwrap().clone();
    Ok(reported_p50_us(&text).ok_or_else(|| format!("no p50 in the scripted reply {text:?}"))?)
}
