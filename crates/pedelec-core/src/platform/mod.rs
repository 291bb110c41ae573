//! Everything in Core that differs by operating system, one module per
//! concern. The session code calls these and never tests the OS itself.
//!
//! | concern | Linux / macOS | Windows |
//! |---|---|---|
//! | [`endpoint`] | Unix socket, 0600 in a 0700 dir | named pipe, ACL of the user alone |
//! | [`process_tree`] | a process group (SIGTERM, SIGKILL) | a Job Object (kill on close) |
//! | [`shutdown`] | SIGTERM, SIGINT | Ctrl-C, Ctrl-Break, console close |
//! | [`command`] | `PATH` | `PATH` and `PATHEXT` (`codex.cmd`) |
//! | [`files`] | modes 0700/0600, `RLIMIT_NOFILE` | the profile's own ACLs |
//! | [`memory`] | Linux: drop clean code pages, `malloc_trim`, when quiet | nothing |

pub mod command;
pub mod endpoint;
pub mod files;
pub mod memory;
pub mod process_tree;
pub mod shutdown;
