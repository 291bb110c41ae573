//! The bounds config.toml sets on a session's asset folder and on the
//! loopback transfer server, and the server's `Host` rule.

use std::time::Duration;

/// The config.toml key of the asset bytes quota, named in `QUOTA_EXCEEDED`'s details.
pub const BYTES_KEY: &str = "asset_bytes_per_session";
/// 1 GiB: ten uploads at the 100 MiB per-file limit, with room to spare.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// Far more than one browser and a few programs use at once, few enough
/// that a flood of idle connections costs little.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// A request head takes a local client milliseconds; a connection that has
/// sent none in this long is not a client worth a slot.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Resolved asset limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssetLimits {
    /// Bytes the asset folder of a session may hold; an upload over it is `QUOTA_EXCEEDED`.
    pub max_bytes: u64,
    /// Connections the transfer server holds open at once; more are closed on accept.
    pub max_connections: usize,
    /// How long a connection may take to send a request head before it is closed.
    pub header_timeout: Duration,
}

impl Default for AssetLimits {
    fn default() -> Self {
        AssetLimits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
        }
    }
}

/// Whether a request's `Host` names the transfer server itself: a loopback
/// name with the server's own port. A page on another name that resolves to
/// 127.0.0.1 (DNS rebinding) sends that name, and is refused.
pub fn is_own_host(host: Option<&str>, port: u16) -> bool {
    let Some(host) = host else { return false };
    let Some((name, host_port)) = host.rsplit_once(':') else { return false };
    host_port.parse::<u16>().is_ok_and(|p| p == port)
        && (name == "127.0.0.1" || name.eq_ignore_ascii_case("localhost") || name == "[::1]")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

    #[test]
    fn only_the_servers_own_loopback_authority_is_its_host() {
        for good in ["127.0.0.1:4000", "localhost:4000", "LocalHost:4000", "[::1]:4000"] {
            assert!(is_own_host(Some(good), 4000), "{good}");
        }
        for bad in [
            None,
            Some(""),
            Some("127.0.0.1"),
            Some("localhost"),
            Some("127.0.0.1:4001"),
            Some("127.0.0.1:04000x"),
            Some("evil.example:4000"),
            Some("127.0.0.1.evil.example:4000"),
            Some("localhost.:4000"),
            Some("[::1]"),
            Some("::1:4000"),
            Some("127.0.0.2:4000"),
            Some("127.0.0.1:4000:4000"),
        ] {
            assert!(!is_own_host(bad, 4000), "{bad:?}");
        }
    }

    #[test]
    fn settings_set_the_limits_and_zero_is_refused() {
        let settings = Settings::parse(
            "asset_bytes_per_session = 5\nasset_server_connections = 2\nasset_header_timeout_secs = 3\n",
        )
        .unwrap();
        let limits = settings.asset_limits();
        assert_eq!(limits, AssetLimits { max_bytes: 5, max_connections: 2, header_timeout: Duration::from_secs(3) });
        assert_eq!(Settings::default().asset_limits(), AssetLimits::default());
        assert!(Settings::parse("asset_server_connections = 0").unwrap_err().contains("asset_server_connections"));
        assert!(Settings::parse("asset_header_timeout_secs = 0").unwrap_err().contains("asset_header_timeout_secs"));
    }
}
