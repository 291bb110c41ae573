//! The JSON-lines record a fake agent leaves for the tests.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::Value;

/// Appends events to the file `$env_var` names; does nothing without it.
pub struct EventLog {
    path: Option<PathBuf>,
    lock: Mutex<()>,
}

impl EventLog {
    pub fn from_env(env_var: &str) -> Self {
        EventLog { path: std::env::var_os(env_var).map(PathBuf::from), lock: Mutex::new(()) }
    }

    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    /// Writes `{"event": event, ...fields}` as one line, flushed at once so a
    /// test (or a crash right after) sees it.
    pub fn record(&self, event: &str, fields: Value) {
        let Some(path) = &self.path else { return };
        let mut line = serde_json::json!({ "event": event });
        if let (Some(into), Value::Object(extra)) = (line.as_object_mut(), fields) {
            into.extend(extra);
        }
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| writeln!(file, "{line}"));
        if let Err(error) = written {
            eprintln!("pedelec-fake-acp: cannot write the log {}: {error}", path.display());
        }
    }
}

/// Reads a log back: every line parsed (tests use this).
pub fn read_events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}
