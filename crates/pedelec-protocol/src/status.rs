//! Session statuses, what each allows, and the legal transitions between them.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::SessionStatus::*;
//!
//! // A turn that waits for a frontend tool: every step is legal.
//! let path = [Idle, Running, WaitingToolResult, Running, Idle];
//! assert!(path.windows(2).all(|step| step[0].can_transition_to(step[1])));
//! // An ended session only comes back through resume (ended → idle).
//! assert!(Ended.transition(Running).is_err());
//! ```

use crate::pb;

/// The lifecycle status of a session, as both Core and the SDK track it.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::SessionStatus;
///
/// let status = SessionStatus::WaitingToolResult;
/// assert_eq!(status.to_string(), "waiting_tool_result");
/// assert!(status.is_active_turn());
/// assert!(!status.can_send_text());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionStatus {
    /// No active turn; ready for another prompt.
    Idle,
    /// Preparation or a user turn is active.
    Running,
    /// The agent requested a frontend tool and is waiting.
    WaitingToolResult,
    /// The session has ended; `resume()` may reactivate it.
    Ended,
    /// The runtime reported a session error.
    Error,
}

impl SessionStatus {
    /// The seed's lower-case string (`"waiting_tool_result"`, …).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::SessionStatus;
    ///
    /// assert_eq!(SessionStatus::Idle.as_str(), "idle");
    /// assert_eq!(SessionStatus::WaitingToolResult.as_str(), "waiting_tool_result");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Idle => "idle",
            SessionStatus::Running => "running",
            SessionStatus::WaitingToolResult => "waiting_tool_result",
            SessionStatus::Ended => "ended",
            SessionStatus::Error => "error",
        }
    }

    /// Whether `sendText()` (and `prepare()`) may start from this status.
    /// The seed's table: only `idle`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::SessionStatus;
    ///
    /// assert!(SessionStatus::Idle.can_send_text());
    /// assert!(!SessionStatus::Running.can_send_text());
    /// assert!(!SessionStatus::Ended.can_send_text());
    /// ```
    pub const fn can_send_text(self) -> bool {
        matches!(self, SessionStatus::Idle)
    }

    /// Why a new operation (`sendText()`/`prepare()`) may not start from this
    /// status, with its message; `None` when it may. `operation_in_flight`
    /// says whether another operation is already under way.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{ErrorCode, SessionStatus};
    ///
    /// assert_eq!(SessionStatus::Idle.refuse_start(false), None);
    /// // Idle, but this handle's previous send is still on its way to Core.
    /// assert_eq!(SessionStatus::Idle.refuse_start(true).map(|(code, _)| code), Some(ErrorCode::SessionBusy));
    /// assert_eq!(SessionStatus::Ended.refuse_start(false).map(|(code, _)| code), Some(ErrorCode::SessionEnded));
    /// ```
    pub fn refuse_start(self, operation_in_flight: bool) -> Option<(crate::ErrorCode, &'static str)> {
        use crate::ErrorCode;
        match self {
            SessionStatus::Ended => Some((ErrorCode::SessionEnded, "the session has ended")),
            SessionStatus::Error => Some((ErrorCode::SessionError, "the session is in the error status")),
            s if !s.can_send_text() || operation_in_flight => Some((ErrorCode::SessionBusy, "another turn is active")),
            _ => None,
        }
    }

    /// Why assets may not be listed, uploaded or downloaded in this status,
    /// with its message; `None` when they may (every status but `ended`).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{ErrorCode, SessionStatus};
    ///
    /// // Assets stay readable while a turn runs, even after an error.
    /// assert_eq!(SessionStatus::Running.refuse_assets(), None);
    /// assert_eq!(SessionStatus::Error.refuse_assets(), None);
    /// assert_eq!(SessionStatus::Ended.refuse_assets().map(|(code, _)| code), Some(ErrorCode::SessionEnded));
    /// ```
    pub fn refuse_assets(self) -> Option<(crate::ErrorCode, &'static str)> {
        match self {
            SessionStatus::Ended => Some((crate::ErrorCode::SessionEnded, "the session has ended")),
            _ => None,
        }
    }

    /// Whether a turn (preparation or user) is active.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::SessionStatus;
    ///
    /// assert!(SessionStatus::Running.is_active_turn());
    /// assert!(SessionStatus::WaitingToolResult.is_active_turn());
    /// assert!(!SessionStatus::Idle.is_active_turn());
    /// ```
    pub const fn is_active_turn(self) -> bool {
        matches!(self, SessionStatus::Running | SessionStatus::WaitingToolResult)
    }

    /// Whether moving from `self` to `next` is a legal transition. Staying in
    /// the same status is always legal (and is not a change).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::SessionStatus::*;
    ///
    /// assert!(Idle.can_transition_to(Running));
    /// assert!(Ended.can_transition_to(Ended));
    /// // A tool wait never jumps straight back to idle: the turn resumes first.
    /// assert!(!WaitingToolResult.can_transition_to(Idle));
    /// ```
    pub const fn can_transition_to(self, next: SessionStatus) -> bool {
        use SessionStatus::*;
        if self as u8 == next as u8 {
            return true;
        }
        matches!(
            (self, next),
            (Idle, Running)
                | (Running, Idle)
                | (Running, WaitingToolResult)
                | (WaitingToolResult, Running)
                | (Running, Error)
                | (WaitingToolResult, Error)
                | (Idle, Error)
                | (Running, Ended)
                | (WaitingToolResult, Ended)
                | (Idle, Ended)
                | (Error, Ended)
                | (Ended, Idle)
        )
    }

    /// Checks a transition, naming both ends when it is illegal.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::SessionStatus::*;
    /// use pedelec_protocol::status::IllegalTransition;
    ///
    /// assert_eq!(Idle.transition(Running), Ok(Running));
    /// let refused = Error.transition(Idle).unwrap_err();
    /// assert_eq!(refused, IllegalTransition { from: Error, to: Idle });
    /// assert_eq!(refused.to_string(), "illegal session status transition error → idle");
    /// ```
    pub fn transition(self, next: SessionStatus) -> Result<SessionStatus, IllegalTransition> {
        if self.can_transition_to(next) { Ok(next) } else { Err(IllegalTransition { from: self, to: next }) }
    }

    /// From the wire enum; `UNSPECIFIED` and unknown values are `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{SessionStatus, pb};
    ///
    /// assert_eq!(SessionStatus::from_pb(pb::SessionStatus::Running as i32), Some(SessionStatus::Running));
    /// assert_eq!(SessionStatus::from_pb(pb::SessionStatus::Unspecified as i32), None);
    /// assert_eq!(SessionStatus::from_pb(99), None);
    /// ```
    pub fn from_pb(value: i32) -> Option<Self> {
        match pb::SessionStatus::try_from(value).ok()? {
            pb::SessionStatus::Unspecified => None,
            pb::SessionStatus::Idle => Some(SessionStatus::Idle),
            pb::SessionStatus::Running => Some(SessionStatus::Running),
            pb::SessionStatus::WaitingToolResult => Some(SessionStatus::WaitingToolResult),
            pb::SessionStatus::Ended => Some(SessionStatus::Ended),
            pb::SessionStatus::Error => Some(SessionStatus::Error),
        }
    }

    /// To the wire enum.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{SessionStatus, pb};
    ///
    /// let wire = SessionStatus::Ended.to_pb();
    /// assert_eq!(wire, pb::SessionStatus::Ended);
    /// assert_eq!(SessionStatus::from_pb(wire as i32), Some(SessionStatus::Ended));
    /// ```
    pub fn to_pb(self) -> pb::SessionStatus {
        match self {
            SessionStatus::Idle => pb::SessionStatus::Idle,
            SessionStatus::Running => pb::SessionStatus::Running,
            SessionStatus::WaitingToolResult => pb::SessionStatus::WaitingToolResult,
            SessionStatus::Ended => pb::SessionStatus::Ended,
            SessionStatus::Error => pb::SessionStatus::Error,
        }
    }

    /// Parses the seed's lower-case string.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::SessionStatus;
    ///
    /// assert_eq!(SessionStatus::parse("waiting_tool_result"), Some(SessionStatus::WaitingToolResult));
    /// assert_eq!(SessionStatus::parse("Idle"), None);
    /// ```
    pub fn parse(text: &str) -> Option<Self> {
        [
            SessionStatus::Idle,
            SessionStatus::Running,
            SessionStatus::WaitingToolResult,
            SessionStatus::Ended,
            SessionStatus::Error,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transition the status table does not allow.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::SessionStatus;
///
/// let refused = SessionStatus::Ended.transition(SessionStatus::Running).unwrap_err();
/// assert_eq!((refused.from, refused.to), (SessionStatus::Ended, SessionStatus::Running));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal session status transition {from} → {to}")]
pub struct IllegalTransition {
    pub from: SessionStatus,
    pub to: SessionStatus,
}

impl pb::TurnKind {
    /// The seed's `turnKind` string, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::pb::TurnKind;
    ///
    /// assert_eq!(TurnKind::Prepare.seed_str(), Some("prepare"));
    /// assert_eq!(TurnKind::Unspecified.seed_str(), None);
    /// ```
    pub fn seed_str(self) -> Option<&'static str> {
        match self {
            pb::TurnKind::Unspecified => None,
            pb::TurnKind::User => Some("user"),
            pb::TurnKind::Prepare => Some("prepare"),
        }
    }
}

impl pb::EffortLevel {
    /// The seed's `effortLevel` string, if chosen.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::pb::EffortLevel;
    ///
    /// assert_eq!(EffortLevel::High.seed_str(), Some("high"));
    /// assert_eq!(EffortLevel::Unspecified.seed_str(), None);
    /// ```
    pub fn seed_str(self) -> Option<&'static str> {
        match self {
            pb::EffortLevel::Unspecified => None,
            pb::EffortLevel::Default => Some("default"),
            pb::EffortLevel::Low => Some("low"),
            pb::EffortLevel::High => Some("high"),
        }
    }

    /// Parses the seed's `effortLevel` string.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::pb::EffortLevel;
    ///
    /// assert_eq!(EffortLevel::parse_seed("low"), Some(EffortLevel::Low));
    /// assert_eq!(EffortLevel::parse_seed("medium"), None);
    /// ```
    pub fn parse_seed(text: &str) -> Option<Self> {
        match text {
            "default" => Some(pb::EffortLevel::Default),
            "low" => Some(pb::EffortLevel::Low),
            "high" => Some(pb::EffortLevel::High),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn assets_are_usable_in_every_status_but_ended() {
        use SessionStatus::*;
        for status in [Idle, Running, WaitingToolResult, Error] {
            assert_eq!(status.refuse_assets(), None, "{status:?}");
        }
        assert_eq!(Ended.refuse_assets().map(|(code, _)| code), Some(crate::ErrorCode::SessionEnded));
    }

    use super::SessionStatus::*;
    use super::*;

    const ALL: [SessionStatus; 5] = [Idle, Running, WaitingToolResult, Ended, Error];

    #[test]
    fn only_idle_can_send_text() {
        for s in ALL {
            assert_eq!(s.can_send_text(), s == Idle, "{s}");
        }
    }

    #[test]
    fn starting_is_refused_with_the_seed_codes() {
        use crate::ErrorCode::*;
        assert_eq!(Idle.refuse_start(false), None);
        assert_eq!(Idle.refuse_start(true).map(|r| r.0), Some(SessionBusy));
        assert_eq!(Running.refuse_start(false).map(|r| r.0), Some(SessionBusy));
        assert_eq!(WaitingToolResult.refuse_start(false).map(|r| r.0), Some(SessionBusy));
        assert_eq!(Ended.refuse_start(false).map(|r| r.0), Some(SessionEnded));
        assert_eq!(Error.refuse_start(false).map(|r| r.0), Some(SessionError));
    }

    #[test]
    fn seed_common_paths_are_legal() {
        let paths: &[&[SessionStatus]] = &[
            &[Idle, Running, Idle],
            &[Idle, Running, WaitingToolResult, Running, Idle],
            &[Running, Error],
            &[Running, Ended],
            &[WaitingToolResult, Error],
            &[WaitingToolResult, Ended],
            &[Ended, Idle],
        ];
        for path in paths {
            for pair in path.windows(2) {
                assert!(pair[0].transition(pair[1]).is_ok(), "{} → {}", pair[0], pair[1]);
            }
        }
    }

    #[test]
    fn illegal_transitions_are_refused() {
        for (from, to) in [
            (Idle, WaitingToolResult),
            (Ended, Running),
            (Ended, WaitingToolResult),
            (Ended, Error),
            (Error, Running),
            (Error, Idle),
            (WaitingToolResult, Idle),
        ] {
            assert_eq!(from.transition(to), Err(IllegalTransition { from, to }));
        }
    }

    #[test]
    fn staying_put_is_legal() {
        for s in ALL {
            assert!(s.can_transition_to(s));
        }
    }

    #[test]
    fn strings_and_wire_values_round_trip() {
        for s in ALL {
            assert_eq!(SessionStatus::parse(s.as_str()), Some(s));
            assert_eq!(SessionStatus::from_pb(s.to_pb() as i32), Some(s));
        }
        assert_eq!(SessionStatus::from_pb(0), None);
        assert_eq!(SessionStatus::from_pb(99), None);
        assert_eq!(WaitingToolResult.as_str(), "waiting_tool_result");
    }

    #[test]
    fn effort_strings() {
        for e in [pb::EffortLevel::Default, pb::EffortLevel::Low, pb::EffortLevel::High] {
            assert_eq!(pb::EffortLevel::parse_seed(e.seed_str().unwrap()), Some(e));
        }
        assert_eq!(pb::EffortLevel::parse_seed("medium"), None);
    }
}
