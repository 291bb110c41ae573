//! Session statuses, what each allows, and the legal transitions between them.

use crate::pb;

/// The lifecycle status of a session, as both Core and the SDK track it.
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
    pub const fn can_send_text(self) -> bool {
        matches!(self, SessionStatus::Idle)
    }

    /// Why a new operation (`sendText()`/`prepare()`) may not start from this
    /// status, with its message; `None` when it may. `operation_in_flight`
    /// says whether another operation is already under way.
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
    pub fn refuse_assets(self) -> Option<(crate::ErrorCode, &'static str)> {
        match self {
            SessionStatus::Ended => Some((crate::ErrorCode::SessionEnded, "the session has ended")),
            _ => None,
        }
    }

    /// Whether a turn (preparation or user) is active.
    pub const fn is_active_turn(self) -> bool {
        matches!(self, SessionStatus::Running | SessionStatus::WaitingToolResult)
    }

    /// Whether moving from `self` to `next` is a legal transition. Staying in
    /// the same status is always legal (and is not a change).
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
    pub fn transition(self, next: SessionStatus) -> Result<SessionStatus, IllegalTransition> {
        if self.can_transition_to(next) { Ok(next) } else { Err(IllegalTransition { from: self, to: next }) }
    }

    /// From the wire enum; `UNSPECIFIED` and unknown values are `None`.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal session status transition {from} → {to}")]
pub struct IllegalTransition {
    pub from: SessionStatus,
    pub to: SessionStatus,
}

impl pb::TurnKind {
    /// The seed's `turnKind` string, if any.
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
    pub fn seed_str(self) -> Option<&'static str> {
        match self {
            pb::EffortLevel::Unspecified => None,
            pb::EffortLevel::Default => Some("default"),
            pb::EffortLevel::Low => Some("low"),
            pb::EffortLevel::High => Some("high"),
        }
    }

    /// Parses the seed's `effortLevel` string.
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
