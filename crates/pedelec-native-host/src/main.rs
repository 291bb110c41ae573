//! The `pedelec-native-host` binary: a browser launch (`chrome-extension://…/`
//! or Firefox's manifest path + add-on id) runs the relay; otherwise the
//! registration subcommands.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use futures::FutureExt;
use pedelec_native_host::caller::{Caller, allowed_ids};
use pedelec_native_host::registration::{self, Browser, Install};
use pedelec_native_host::{core_link, relay, stdio};
use pedelec_protocol::native::encode_native_frame;
use pedelec_protocol::{ErrorCode, limits, pb};

#[derive(Parser)]
#[command(name = "pedelec-native-host", version, about = "Pedelec's native-messaging host")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Register the host for the current user (or one browser profile).
    Install {
        /// Chromium-family extension id (32 characters a-p); repeatable.
        #[arg(long = "extension-id")]
        extension_ids: Vec<String>,
        /// Firefox add-on id; repeatable.
        #[arg(long = "firefox-addon-id")]
        firefox_addon_ids: Vec<String>,
        #[arg(long, value_parser = registration::parse_browser, default_value = "all")]
        browser: Browser,
        /// A browser profile (user-data dir) to register into instead.
        #[arg(long)]
        profile: Option<PathBuf>,
        /// The host binary to register (default: this one).
        #[arg(long)]
        host_path: Option<PathBuf>,
    },
    /// Remove the registration.
    Uninstall {
        #[arg(long, value_parser = registration::parse_browser, default_value = "all")]
        browser: Browser,
        #[arg(long)]
        profile: Option<PathBuf>,
    },
    /// Show what is registered.
    Status,
}

fn main() -> ExitCode {
    // A browser starts the host for every port, so start-up cost counts: the
    // filter parser only runs when someone asked for logs.
    match tracing_subscriber::EnvFilter::try_from_env("PEDELEC_LOG") {
        Ok(filter) => tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init(),
        Err(_) => tracing_subscriber::fmt().with_max_level(tracing::Level::WARN).with_writer(std::io::stderr).init(),
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(caller) = Caller::from_args(&args) {
        return run_host(caller);
    }
    if args.first().is_some_and(|a| a.starts_with("chrome-extension://")) {
        return refuse("the calling extension id is malformed");
    }
    match Cli::parse().command {
        Command::Install { extension_ids, firefox_addon_ids, browser, profile, host_path } => {
            let host_path = host_path
                .or_else(|| std::env::current_exe().ok())
                .map(registration::manifest_host_path)
                .unwrap_or_default();
            let request = Install { host_path, extension_ids, firefox_addon_ids, browser, profile };
            match registration::install(&registration::current_layout(), &request) {
                Ok(paths) => {
                    paths.iter().for_each(|p| println!("registered {}", p.display()));
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("pedelec-native-host: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Uninstall { browser, profile } => {
            for path in registration::uninstall(&registration::current_layout(), browser, profile.as_deref()) {
                println!("removed {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Command::Status => {
            for entry in registration::status(&registration::current_layout()) {
                let state = match &entry.contents {
                    Some(m) => format!(
                        "registered for {}",
                        m.get("allowed_origins").or(m.get("allowed_extensions")).unwrap_or(&serde_json::Value::Null)
                    ),
                    None => "not registered".into(),
                };
                println!("{:<9} {} ({})", entry.browser.name(), state, entry.manifest.display());
            }
            ExitCode::SUCCESS
        }
    }
}

/// Writes one error frame (the browser shows it to the extension) and exits.
fn refuse(message: &str) -> ExitCode {
    use std::io::Write;
    let frame = pb::NativeFrame {
        request_id: 0,
        body: Some(pb::native_frame::Body::Error(pb::Error::new(ErrorCode::OriginNotAllowed, message))),
        ..Default::default()
    };
    let mut out = std::io::stdout().lock();
    for bytes in encode_native_frame(&frame, limits::NATIVE_HOST_TO_BROWSER_MAX, 0) {
        let _ = out.write_all(&bytes);
    }
    let _ = out.flush();
    eprintln!("pedelec-native-host: {message}");
    ExitCode::FAILURE
}

fn run_host(caller: Caller) -> ExitCode {
    let layout = registration::current_layout();
    let allowed = allowed_ids(|k| std::env::var(k).ok(), &layout.config_home);
    if !allowed.iter().any(|id| id == caller.id()) {
        return refuse(&format!("extension {} is not allowed to use this host", caller.id()));
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(error) => {
            eprintln!("pedelec-native-host: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        use pedelec_protocol::discovery::{default_socket, default_state_dir};
        let env = |k: &str| std::env::var(k).ok();
        let socket = default_socket(env, &default_state_dir(env));
        // Connecting runs alongside the relay's start, so the browser's first
        // frame is read and decoded while the connection is made.
        let connecting =
            tokio::spawn(async move { core_link::connect_or_start(&socket, core_link::core_binary).await });
        let core = async move { connecting.await.ok().flatten().map(Arc::new) }.boxed().shared();
        // The relay runs as a task, not as `block_on`'s own future: every
        // wake of that future writes the runtime's eventfd (it may be parked
        // in epoll), one syscall and one extra epoll round per tool call,
        // while a task woken by another task is queued without either.
        let relay = tokio::spawn(relay::run(stdio::input(), stdio::output(), core));
        let exit = match relay.await {
            Ok(exit) => exit,
            Err(error) => {
                eprintln!("pedelec-native-host: the relay failed: {error}");
                std::process::exit(1)
            }
        };
        tracing::info!(?exit, "relay finished");
        // Exit now: tokio's stdin reader sits in a blocking read that would
        // otherwise hold the runtime's shutdown until the browser closes the pipe.
        std::process::exit(if exit == relay::Exit::InputClosed { 0 } else { 1 })
    })
}
