//! `pedelec-tool`: call the session's frontend tools from a shell.
//!
//! Agents that run shell commands instead of speaking MCP call
//! `pedelec-tool call NAME '{"arg": 1}'`; Core puts the session's tool token
//! and its endpoint in their environment.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "Call the Pedelec session's frontend tools (reads PEDELEC_TOOL_TOKEN and PEDELEC_CORE_SOCKET)"
)]
struct Cli {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Call tool NAME with a JSON object of arguments (`{}` when omitted, `-` reads standard input);
    /// prints the result JSON. Exit 1: the tool failed; 2: the session could not be reached.
    Call { name: String, args_json: Option<String> },
    /// List the session's tools as JSON lines.
    List,
}

fn main() -> std::process::ExitCode {
    let status = match Cli::parse().action {
        Action::Call { name, args_json } => pedelec_tool::run_call(&name, args_json.as_deref()),
        Action::List => pedelec_tool::run_list(),
    };
    std::process::ExitCode::from(status)
}
