//! Agent activities: the bounds every activity is kept within, how an
//! update merges into what is known of it, and the names the SDKs show.
//!
//! Core merges each provider update into the activity it names
//! ([`merge`]) and sends the whole result; an SDK shows it as it comes, with
//! the kind and status names here.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::activity::{merge, summary};
//! use pedelec_protocol::pb::{Activity, ActivityKind, ActivityStatus};
//!
//! let mut known = Activity {
//!     activity_id: "call-1".into(),
//!     kind: ActivityKind::Command as i32,
//!     status: ActivityStatus::InProgress as i32,
//!     title: "Run tests".into(),
//!     command: "cargo test".into(),
//!     ..Default::default()
//! };
//! // The agent's update says only what changed.
//! merge(&mut known, Activity { status: ActivityStatus::Completed as i32, ..Default::default() });
//! assert_eq!(summary(&known), "Run tests: cargo test (completed)");
//! ```

use crate::pb::{self, ActivityKind, ActivityStatus};

/// The most activities one turn keeps (the snapshot's `activities`); later
/// new ones are dropped, updates of known ones still apply.
pub const MAX_TURN_ACTIVITIES: usize = 256;
/// `output` is clipped to this many characters.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::{MAX_OUTPUT_CHARS, bounded};
/// use pedelec_protocol::pb::Activity;
///
/// let clipped = bounded(Activity { output: "x".repeat(1_000_000), ..Default::default() });
/// // The limit, plus the "…" that says it was clipped.
/// assert_eq!(clipped.output.chars().count(), MAX_OUTPUT_CHARS + 1);
/// ```
pub const MAX_OUTPUT_CHARS: usize = 2_000;
/// `title` and each path are clipped to this many characters.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::{MAX_TITLE_CHARS, bounded};
/// use pedelec_protocol::pb::Activity;
///
/// let clipped = bounded(Activity { paths: vec!["p".repeat(5_000)], ..Default::default() });
/// assert!(clipped.paths[0].ends_with('…'));
/// assert_eq!(clipped.paths[0].chars().count(), MAX_TITLE_CHARS + 1);
/// ```
pub const MAX_TITLE_CHARS: usize = 300;
/// `command` is clipped to this many characters.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::{MAX_COMMAND_CHARS, bounded};
/// use pedelec_protocol::pb::Activity;
///
/// let short = bounded(Activity { command: "ls -la".into(), ..Default::default() });
/// assert_eq!(short.command, "ls -la");
/// let long = bounded(Activity { command: "a".repeat(MAX_COMMAND_CHARS + 10), ..Default::default() });
/// assert_eq!(long.command.chars().count(), MAX_COMMAND_CHARS + 1);
/// ```
pub const MAX_COMMAND_CHARS: usize = 2_000;
/// The most paths and plan entries kept.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::{MAX_ITEMS, bounded};
/// use pedelec_protocol::pb::Activity;
///
/// let many = bounded(Activity { paths: vec!["src/lib.rs".into(); 10_000], ..Default::default() });
/// assert_eq!(many.paths.len(), MAX_ITEMS);
/// ```
pub const MAX_ITEMS: usize = 64;

fn clip(text: &mut String, chars: usize) {
    if let Some((cut, _)) = text.char_indices().nth(chars) {
        text.truncate(cut);
        text.push('…');
    }
}

/// The activity within the bounds above (what an agent sends is not ours
/// to trust: a 10 MB command output stays 2 000 characters).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::{MAX_OUTPUT_CHARS, bounded};
/// use pedelec_protocol::pb::Activity;
///
/// let huge = Activity { output: "y".repeat(10_000_000), ..Default::default() };
/// assert!(bounded(huge).output.chars().count() <= MAX_OUTPUT_CHARS + 1);
/// ```
pub fn bounded(mut activity: pb::Activity) -> pb::Activity {
    clip(&mut activity.activity_id, crate::limits::MAX_ID_LEN);
    clip(&mut activity.title, MAX_TITLE_CHARS);
    clip(&mut activity.command, MAX_COMMAND_CHARS);
    clip(&mut activity.output, MAX_OUTPUT_CHARS);
    activity.paths.truncate(MAX_ITEMS);
    activity.paths.iter_mut().for_each(|p| clip(p, MAX_TITLE_CHARS));
    activity.plan.truncate(MAX_ITEMS);
    activity.plan.iter_mut().for_each(|e| clip(&mut e.content, MAX_TITLE_CHARS));
    activity
}

/// Applies `update` to `known`: every field the update sets replaces the
/// known one (a kind or status other than unspecified, a non-empty text or
/// list); the rest stays.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::merge;
/// use pedelec_protocol::pb::{Activity, ActivityKind, ActivityStatus};
///
/// let mut known = Activity {
///     kind: ActivityKind::FileEdit as i32,
///     title: "Edit".into(),
///     paths: vec!["src/main.rs".into()],
///     ..Default::default()
/// };
/// merge(&mut known, Activity { output: "1 file changed".into(), ..Default::default() });
/// // Unset fields of the update leave the known ones alone.
/// assert_eq!(known.kind, ActivityKind::FileEdit as i32);
/// assert_eq!(known.paths, ["src/main.rs"]);
/// assert_eq!(known.output, "1 file changed");
/// assert_eq!(known.status, ActivityStatus::Unspecified as i32);
/// ```
pub fn merge(known: &mut pb::Activity, update: pb::Activity) {
    if update.kind != ActivityKind::Unspecified as i32 {
        known.kind = update.kind;
    }
    if update.status != ActivityStatus::Unspecified as i32 {
        known.status = update.status;
    }
    for (into, from) in
        [(&mut known.title, update.title), (&mut known.command, update.command), (&mut known.output, update.output)]
    {
        if !from.is_empty() {
            *into = from;
        }
    }
    if !update.paths.is_empty() {
        known.paths = update.paths;
    }
    if !update.plan.is_empty() {
        known.plan = update.plan;
    }
    *known = bounded(std::mem::take(known));
}

/// Whether the activity is over (completed or failed).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::is_settled;
/// use pedelec_protocol::pb::{Activity, ActivityStatus};
///
/// let with = |status: ActivityStatus| Activity { status: status as i32, ..Default::default() };
/// assert!(is_settled(&with(ActivityStatus::Failed)));
/// assert!(!is_settled(&with(ActivityStatus::InProgress)));
/// ```
pub fn is_settled(activity: &pb::Activity) -> bool {
    matches!(ActivityStatus::try_from(activity.status), Ok(ActivityStatus::Completed | ActivityStatus::Failed))
}

/// The kind's snake_case name ("command", "file_edit", …; "other" for unspecified).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::kind_name;
/// use pedelec_protocol::pb::ActivityKind;
///
/// assert_eq!(kind_name(ActivityKind::FileEdit as i32), "file_edit");
/// // A kind from a newer Core still gets a name.
/// assert_eq!(kind_name(99), "other");
/// ```
pub fn kind_name(kind: i32) -> &'static str {
    match ActivityKind::try_from(kind).unwrap_or(ActivityKind::Unspecified) {
        ActivityKind::Command => "command",
        ActivityKind::FileEdit => "file_edit",
        ActivityKind::FileRead => "file_read",
        ActivityKind::Search => "search",
        ActivityKind::Fetch => "fetch",
        ActivityKind::ToolCall => "tool_call",
        ActivityKind::Plan => "plan",
        ActivityKind::Thinking => "thinking",
        ActivityKind::Permission => "permission",
        ActivityKind::Note => "note",
        ActivityKind::Unspecified => "other",
    }
}

/// The status's snake_case name, `None` for unspecified.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::status_name;
/// use pedelec_protocol::pb::ActivityStatus;
///
/// assert_eq!(status_name(ActivityStatus::InProgress as i32), Some("in_progress"));
/// assert_eq!(status_name(ActivityStatus::Unspecified as i32), None);
/// ```
pub fn status_name(status: i32) -> Option<&'static str> {
    match ActivityStatus::try_from(status).unwrap_or(ActivityStatus::Unspecified) {
        ActivityStatus::Pending => Some("pending"),
        ActivityStatus::InProgress => Some("in_progress"),
        ActivityStatus::Completed => Some("completed"),
        ActivityStatus::Failed => Some("failed"),
        ActivityStatus::Unspecified => None,
    }
}

/// One line for a transcript or a log: title, what it ran or touched, status.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::activity::summary;
/// use pedelec_protocol::pb::{Activity, ActivityStatus, PlanEntry};
///
/// let entry = |status: ActivityStatus| PlanEntry { content: "step".into(), status: status as i32 };
/// let plan = Activity {
///     title: "Plan".into(),
///     plan: vec![entry(ActivityStatus::Completed), entry(ActivityStatus::Pending)],
///     status: ActivityStatus::InProgress as i32,
///     ..Default::default()
/// };
/// assert_eq!(summary(&plan), "Plan (1/2 done) (in_progress)");
/// ```
pub fn summary(activity: &pb::Activity) -> String {
    let mut line = activity.title.clone();
    if !activity.command.is_empty() && activity.command != activity.title {
        line = if line.is_empty() { activity.command.clone() } else { format!("{line}: {}", activity.command) };
    }
    if !activity.paths.is_empty() {
        line = format!("{line} {}", activity.paths.join(", "));
    }
    if !activity.plan.is_empty() {
        let done = activity.plan.iter().filter(|e| e.status == ActivityStatus::Completed as i32).count();
        line = format!("{line} ({done}/{} done)", activity.plan.len());
    }
    if line.trim().is_empty() {
        line = activity.output.chars().take(200).collect();
    }
    match status_name(activity.status) {
        Some(status) => format!("{} ({status})", line.trim()),
        None => line.trim().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity(id: &str, kind: ActivityKind, status: ActivityStatus) -> pb::Activity {
        pb::Activity { activity_id: id.into(), kind: kind as i32, status: status as i32, ..Default::default() }
    }

    #[test]
    fn an_update_replaces_what_it_sets_and_keeps_the_rest() {
        let mut known = pb::Activity {
            title: "Run tests".into(),
            command: "cargo test".into(),
            ..activity("t1", ActivityKind::Command, ActivityStatus::InProgress)
        };
        merge(
            &mut known,
            pb::Activity {
                output: "ok".into(),
                ..activity("t1", ActivityKind::Unspecified, ActivityStatus::Completed)
            },
        );
        assert_eq!(known.kind, ActivityKind::Command as i32);
        assert_eq!(known.status, ActivityStatus::Completed as i32);
        assert_eq!(
            (known.title.as_str(), known.command.as_str(), known.output.as_str()),
            ("Run tests", "cargo test", "ok")
        );
        assert!(is_settled(&known));
        assert_eq!(summary(&known), "Run tests: cargo test (completed)");
    }

    #[test]
    fn hostile_sizes_are_clipped() {
        let huge = pb::Activity {
            activity_id: "x".repeat(10_000),
            output: "y".repeat(1_000_000),
            paths: vec!["p".repeat(5_000); 10_000],
            ..activity("", ActivityKind::FileEdit, ActivityStatus::Pending)
        };
        let b = bounded(huge);
        assert!(b.activity_id.chars().count() <= crate::limits::MAX_ID_LEN + 1);
        assert_eq!(b.output.chars().count(), MAX_OUTPUT_CHARS + 1);
        assert_eq!(b.paths.len(), MAX_ITEMS);
        assert!(b.paths.iter().all(|p| p.chars().count() == MAX_TITLE_CHARS + 1));
    }

    #[test]
    fn every_kind_and_status_has_a_name() {
        for kind in 1..=10 {
            assert_ne!(kind_name(kind), "other", "{kind}");
        }
        assert_eq!(kind_name(0), "other");
        assert_eq!(kind_name(99), "other");
        assert_eq!(status_name(0), None);
        assert_eq!(status_name(4), Some("failed"));
    }
}
