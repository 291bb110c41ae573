//! The `pedelec-core` binary: argument parsing only.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pedelec_core::CoreConfig;

#[derive(Parser)]
#[command(name = "pedelec-core", version, about = "The Pedelec Core daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Core gRPC API on a Unix socket until SIGINT/SIGTERM.
    Serve {
        /// Socket path (default: $XDG_RUNTIME_DIR/pedelec/core.sock).
        #[arg(long, env = "PEDELEC_CORE_SOCKET")]
        socket: Option<PathBuf>,
        /// State directory: database, managed workspaces (default: $XDG_STATE_HOME/pedelec).
        #[arg(long, env = "PEDELEC_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// How long a session with auto_end_on_disconnect waits for a subscriber to come back.
        #[arg(long, default_value_t = 3000)]
        disconnect_grace_ms: u64,
        /// How long an asset transfer ticket stays valid.
        #[arg(long, default_value_t = 60_000)]
        asset_ticket_ttl_ms: u64,
        /// Async worker threads; 0 runs everything on one current-thread runtime.
        #[arg(long, env = "PEDELEC_CORE_THREADS", default_value_t = 2)]
        worker_threads: usize,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PEDELEC_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let Command::Serve { socket, state_dir, disconnect_grace_ms, asset_ticket_ttl_ms, worker_threads } =
        Cli::parse().command;
    let mut config = CoreConfig::resolve(socket, state_dir, Duration::from_millis(disconnect_grace_ms));
    config.asset_ticket_ttl = Duration::from_millis(asset_ticket_ttl_ms);
    let runtime = match runtime_builder(worker_threads).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pedelec-core: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(pedelec_core::daemon::serve(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pedelec-core: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn runtime_builder(worker_threads: usize) -> tokio::runtime::Builder {
    if worker_threads == 0 {
        return tokio::runtime::Builder::new_current_thread();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(worker_threads);
    builder
}
