//! pedelec-core: the daemon that owns every agent session.
//!
//! [`daemon::serve`] binds the Unix socket and serves the `Core` and
//! `AgentTools` gRPC services ([`service`]) over a [`registry::Registry`] of
//! [`session::Session`]s, persisted in SQLite ([`store`]), working in
//! [`workspace`]s, answered by [`providers`].

pub mod activity_log;
pub mod assets;
pub mod bridge;
pub mod changes;
pub mod clock;
pub mod config;
pub mod connections;
pub mod consent;
pub mod daemon;
pub mod doctor;
pub mod error;
pub mod folder_picker;
pub mod fork_copy;
pub mod history;
pub mod nofollow;
pub mod output;
pub mod platform;
pub mod providers;
pub mod quota;
pub mod registry;
pub mod service;
pub mod session;
pub mod settings;
pub mod settings_file;
pub mod store;
pub mod tool_socket;
pub mod tool_token;
pub mod tools;
pub mod transcript;
pub mod workspace;
pub mod workspace_policy;
pub mod writeback;

pub use config::CoreConfig;
pub use error::{CoreError, CoreResult};
