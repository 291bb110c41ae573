//! The `pedelec-core` binary: argument parsing only.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pedelec_core::CoreConfig;

/// See `platform::memory::Allocator` for why (Linux only).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: pedelec_core::platform::memory::Allocator = mimalloc::MiMalloc;

/// The allocator's options, set by the loader (`.init_array`) before Rust's
/// runtime starts and allocates (`platform::memory::configure_allocator`
/// says why).
#[cfg(target_os = "linux")]
#[unsafe(link_section = ".init_array")]
#[used]
static ALLOCATOR_SETUP: extern "C" fn() = pedelec_core::platform::memory::configure_allocator;

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
        /// State directory: database, lock, discovery file (default: $XDG_STATE_HOME/pedelec). Managed
        /// workspaces live outside it (`$PEDELEC_WORKSPACES_DIR` to choose; see `config::workspaces_dir`).
        #[arg(long, env = "PEDELEC_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// How long a session with auto_end_on_disconnect waits for a subscriber to come back.
        #[arg(long, default_value_t = 3000)]
        disconnect_grace_ms: u64,
        /// How long an asset transfer ticket stays valid.
        #[arg(long, default_value_t = 60_000)]
        asset_ticket_ttl_ms: u64,
        /// Async worker threads; 0 runs everything on one current-thread runtime.
        // Two by default: one worker avoids a futex wake at each hand-off
        // between tasks and so shortens the tool round trip, but costs
        // provider delta throughput, where parsing and delivery overlap on
        // two (docs/performance.md has the figures).
        #[arg(long, env = "PEDELEC_CORE_THREADS", default_value_t = 2)]
        worker_threads: usize,
        /// Directory of config.toml, the settings (default: $XDG_CONFIG_HOME/pedelec).
        #[arg(long, env = "PEDELEC_CONFIG_DIR")]
        config_dir: Option<PathBuf>,
        /// Connections at most at once; one more is closed at once.
        #[arg(long, default_value_t = pedelec_core::connections::DEFAULT_MAX_CONNECTIONS)]
        max_connections: usize,
        /// How long a new connection may stay silent before it is closed.
        #[arg(long, default_value_t = 10_000)]
        handshake_timeout_ms: u64,
        /// How long Core must be quiet before it hands back the code pages
        /// and free heap its work left mapped (Linux: a lower RSS; code run
        /// after it faults back in from the page cache); 0 never does.
        #[arg(long, env = "PEDELEC_CORE_TRIM_AFTER_QUIET_MS",
              default_value_t = pedelec_core::platform::memory::QUIET_TICK.as_millis() as u64)]
        trim_after_quiet_ms: u64,
        /// Tests only: append every tool token Core mints to this file. The
        /// database holds only digests, and a test that plays the agent
        /// needs the token; whoever can pass Core flags owns it anyway.
        #[arg(long, hide = true)]
        tool_token_witness: Option<PathBuf>,
    },
    /// Say what a user needs to know when something does not work: Core's
    /// socket and whether it answers, the state dir, the settings, each
    /// provider's availability, the native host's registration per browser.
    Doctor {
        #[arg(long, env = "PEDELEC_CORE_SOCKET")]
        socket: Option<PathBuf>,
        #[arg(long, env = "PEDELEC_STATE_DIR")]
        state_dir: Option<PathBuf>,
        #[arg(long, env = "PEDELEC_CONFIG_DIR")]
        config_dir: Option<PathBuf>,
    },
    /// Serve the session's frontend tools to an agent as a stdio MCP server
    /// (started by agents from the configuration Core gives them; reads
    /// PEDELEC_TOOL_TOKEN and PEDELEC_CORE_SOCKET from the environment).
    Mcp,
    /// Call or list the session's frontend tools from a shell (same environment as `mcp`).
    Tool {
        #[command(subcommand)]
        action: ToolAction,
    },
}

#[derive(Subcommand)]
enum ToolAction {
    /// Call tool NAME with a JSON object of arguments (`{}` when omitted, `-` reads standard input);
    /// prints the result JSON. The `pedelec-tool` binary does the same and starts faster.
    Call { name: String, args_json: Option<String> },
    /// List the session's tools as JSON lines.
    List,
}

fn main() -> std::process::ExitCode {
    // Before any thread or connection exists (it says why).
    let sqlite_configured = pedelec_core::store::configure_sqlite();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PEDELEC_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    if !sqlite_configured {
        tracing::warn!("SQLite refused its settings: it had started before main");
    }
    match Cli::parse().command {
        Command::Serve {
            socket,
            state_dir,
            disconnect_grace_ms,
            asset_ticket_ttl_ms,
            worker_threads,
            config_dir,
            max_connections,
            handshake_timeout_ms,
            trim_after_quiet_ms,
            tool_token_witness,
        } => {
            let mut config = CoreConfig::resolve(socket, state_dir, Duration::from_millis(disconnect_grace_ms));
            config.asset_ticket_ttl = Duration::from_millis(asset_ticket_ttl_ms);
            config.connections = pedelec_core::connections::Limits {
                max: max_connections.max(1),
                handshake: Duration::from_millis(handshake_timeout_ms.max(1)),
            };
            if let Some(dir) = config_dir {
                config.config_dir = dir;
            }
            config.trim_after_quiet = (trim_after_quiet_ms > 0).then(|| Duration::from_millis(trim_after_quiet_ms));
            config.tool_token_witness = tool_token_witness;
            run(runtime_builder(worker_threads), async move {
                pedelec_core::daemon::serve(config).await.map_err(|e| e.to_string())
            })
        }
        Command::Doctor { socket, state_dir, config_dir } => {
            let mut config = CoreConfig::resolve(socket, state_dir, Duration::ZERO);
            if let Some(dir) = config_dir {
                config.config_dir = dir;
            }
            run(tokio::runtime::Builder::new_current_thread(), async move {
                let layout = pedelec_protocol::registration::Layout::from_env(|k| std::env::var(k).ok());
                print!("{}", pedelec_core::doctor::report(&config, &layout).await);
                Ok(())
            })
        }
        Command::Mcp => run(tokio::runtime::Builder::new_current_thread(), async {
            pedelec_core::bridge::serve_mcp().await.map_err(|e| e.to_string())
        }),
        Command::Tool { action } => std::process::ExitCode::from(match action {
            ToolAction::Call { name, args_json } => pedelec_tool::run_call(&name, args_json.as_deref()),
            ToolAction::List => pedelec_tool::run_list(),
        }),
    }
}

fn run(
    mut builder: tokio::runtime::Builder,
    work: impl std::future::Future<Output = Result<(), String>>,
) -> std::process::ExitCode {
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pedelec-core: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
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
