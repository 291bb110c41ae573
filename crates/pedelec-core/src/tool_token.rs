//! Tool tokens: the secret a session's agent presents on every `AgentTools`
//! call, and the digest Core keeps of it.
//!
//! The plain token lives only in Core's memory and in the agent's
//! environment. The database holds its SHA-256 digest, so a process that
//! reads Core's state directory (an agent whose sandbox lets it) learns no
//! token it could call tools with. A restart or a resume cannot recover the
//! plain token from the digest: Core mints a fresh one then, and the agent
//! it starts is given that.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// How a stored digest is marked, which tells it from the plain tokens an
/// older database held (both are 64 hex digits).
const DIGEST_PREFIX: &str = "sha256:";

/// A plain tool token: 256 random bits as 64 hex digits. Never written to
/// disk by Core; `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ToolToken(String);

impl ToolToken {
    /// A new random token.
    pub fn mint() -> Self {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        ToolToken(hex::encode(bytes))
    }

    /// The token as the agent presents it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn digest(&self) -> ToolTokenDigest {
        ToolTokenDigest::of(&self.0)
    }
}

impl std::fmt::Debug for ToolToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToolToken(…)")
    }
}

/// What Core stores and looks tokens up by: `sha256:<64 hex digits>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolTokenDigest(String);

impl ToolTokenDigest {
    /// The digest of a presented token (any string: a forged one has a
    /// digest too, just not one Core knows).
    pub fn of(token: &str) -> Self {
        ToolTokenDigest(format!("{DIGEST_PREFIX}{}", hex::encode(Sha256::digest(token.as_bytes()))))
    }

    /// A column value read back: a digest as stored, or — from a database
    /// written before tokens were hashed — the plain token, digested now.
    pub fn from_stored(stored: &str) -> Self {
        if Self::is_digest(stored) { ToolTokenDigest(stored.to_owned()) } else { Self::of(stored) }
    }

    /// Whether a stored column value is already a digest.
    pub fn is_digest(stored: &str) -> bool {
        stored.starts_with(DIGEST_PREFIX)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Compared in constant time: the lookup by digest already names a
    /// session, and this second check must not tell an attacker how many
    /// leading bytes of a guess were right.
    pub fn matches(&self, other: &ToolTokenDigest) -> bool {
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_marked_stable_and_hides_the_token() {
        let token = ToolToken::mint();
        assert_eq!(token.expose().len(), 64);
        let digest = token.digest();
        assert!(digest.as_str().starts_with("sha256:"));
        assert!(!digest.as_str().contains(token.expose()));
        assert!(digest.matches(&ToolTokenDigest::of(token.expose())));
        assert!(!digest.matches(&ToolTokenDigest::of(&"0".repeat(64))));
        assert_eq!(ToolTokenDigest::from_stored(digest.as_str()), digest, "a stored digest reads back as itself");
        assert_eq!(ToolTokenDigest::from_stored(token.expose()), digest, "a legacy plain token is digested");
        assert_ne!(ToolToken::mint(), token);
        assert!(!format!("{token:?}").contains(token.expose()));
        // SHA-256("abc"), the FIPS 180-2 example.
        assert_eq!(
            ToolTokenDigest::of("abc").as_str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
