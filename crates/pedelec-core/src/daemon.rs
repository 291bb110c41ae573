//! `pedelec-core serve`: the socket, the discovery file, signals and clean shutdown.

use std::path::Path;
use std::sync::Arc;

use pedelec_protocol::ErrorCode;
use pedelec_protocol::pb::{
    agent_tools_server::AgentToolsServer, core_relay_server::CoreRelayServer, core_server::CoreServer,
};

use crate::config::CoreConfig;
use crate::error::{CoreError, CoreResult};
use crate::platform::memory;
use crate::providers::Providers;
use crate::registry::Registry;
use crate::service::{AgentToolsService, CoreService};
use crate::session::Shared;
use crate::store::Store;

/// Exactly one Core per state dir: an advisory lock on `state_dir/core.lock`,
/// held for the life of the process (the kernel lets go of it when the
/// process dies, so a crash never leaves it held). Taken before the socket
/// is bound, so the stale-socket takeover below — a check, then an act —
/// is only ever done by the one Core that owns the state.
fn lock_state_dir(dir: &Path) -> CoreResult<std::fs::File> {
    let path = dir.join("core.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| CoreError::io(format!("opening {}", path.display()), e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(CoreError::with_details(
            ErrorCode::CoreRuntimeUnavailable,
            format!("another Core is already serving the state in {}", dir.display()),
            serde_json::json!({ "stateDir": dir.display().to_string() }),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(CoreError::io(format!("locking {}", path.display()), e)),
    }
}

/// Runs Core until SIGINT/SIGTERM, then shuts down cleanly.
pub async fn serve(config: CoreConfig) -> CoreResult<()> {
    // Signal handlers first: a SIGTERM at any point after this is a clean shutdown.
    let signals = crate::platform::shutdown::Signals::install()?;
    // A bad settings file stops Core before it binds: better than running the wrong agent.
    let settings = crate::settings::Settings::load(&config.config_dir)?;
    let providers = Providers::from_settings(&settings)?;
    crate::platform::files::raise_open_file_limit();
    crate::platform::files::ensure_private_dir(&config.state_dir)?;
    let _state_lock = lock_state_dir(&config.state_dir)?;
    // Private like the state dir: a managed workspace's runtime files (a
    // claude session's MCP config) carry its tool token.
    crate::platform::files::ensure_private_dir(&config.managed_root())?;
    let listener = crate::platform::endpoint::Listener::bind(&config.socket).await?;
    // The tool socket goes with the gRPC endpoint; binding it second means
    // the check above already refused a live Core.
    let tool_endpoint =
        pedelec_protocol::tool_socket::endpoint_for(pedelec_protocol::discovery::Platform::current(), &config.socket);
    let tool_listener = crate::platform::endpoint::Listener::bind(&tool_endpoint).await?;
    // The asset hand-off socket too, where descriptors can be passed (Unix).
    #[cfg(unix)]
    let handoff_endpoint = pedelec_protocol::handoff::endpoint_for(&config.socket);
    #[cfg(unix)]
    let handoff_listener = crate::platform::endpoint::Listener::bind(&handoff_endpoint).await?;
    // Only now is this the state dir's one Core: agents a dead Core left are ours to end.
    let leftovers = crate::platform::process_tree::end_leftovers(&config.state_dir);
    if leftovers > 0 {
        tracing::info!(leftovers, "ended agent process groups a previous Core left running");
    }
    let started = std::time::Instant::now();
    let (store, records) = Store::open(&config.database())?;
    let assets = crate::assets::AssetServer::start(config.asset_ticket_ttl, settings.asset_limits()).await?;
    let (released_tx, released) = tokio::sync::mpsc::unbounded_channel();
    let consent = Arc::new(crate::consent::Consent::from_stored(store.consents().await?));
    let shared = Arc::new(Shared {
        store,
        consent,
        assets: assets.clone(),
        providers: crate::providers::LiveProviders::new(providers),
        config_file: Some(crate::settings::Settings::file_in(&config.config_dir)),
        disconnect_grace: config.disconnect_grace,
        turn_timeout: settings.turn_timeout(),
        permission_timeout: settings.permission_timeout(),
        agent_idle_timeout: settings.agent_idle_timeout(),
        core_exe: std::env::current_exe().map_err(|e| CoreError::io("locating the pedelec-core executable", e))?,
        socket: config.socket.clone(),
        released: released_tx,
        quotas: settings.quotas(),
        private_dirs: vec![config.state_dir.clone(), config.config_dir.clone()],
        log_bounds: crate::session::log::Bounds {
            session_bytes: settings.event_log_bytes().0,
            ..crate::session::log::Bounds::default()
        },
        log_budget: crate::session::log::Budget::new(settings.event_log_bytes().1),
    });
    crate::quota::AGENT_PROCESSES.set_max(settings.quotas().max_agent_processes);
    // Once the process limit is known: a warm process leaves room below it.
    shared.providers.now().warm_up();
    use pedelec_protocol::discovery::{Platform, home_dir_for};
    let home = home_dir_for(Platform::current(), |k| std::env::var(k).ok());
    let policy = crate::workspace_policy::WorkspacePolicy::new(
        home.as_deref(),
        &settings.allowed_workspace_roots,
        // The managed root too: one session's managed workspace is no other's to open.
        &[&config.state_dir, &config.config_dir, &config.managed_root()],
    );
    let registry = Arc::new(
        Registry::new(shared, config.managed_root(), policy)
            .with_token_witness(config.tool_token_witness.clone())
            .with_legacy_managed_root(config.legacy_managed_root()),
    );
    let restored = records.len();
    registry.restore(records);
    tokio::spawn(maintain(registry.clone(), released, settings.ended_retention(), config.trim_after_quiet));
    // Written once sessions are restored: a client that finds the file (with
    // this pid) is served at once; earlier connections wait in the backlog.
    let discovery = config.discovery_file();
    let body = serde_json::json!({ "pid": std::process::id(), "socket": config.socket.display().to_string() });
    // Atomic: a reader never sees a half-written file.
    let partial = discovery.with_extension("json.partial");
    std::fs::write(&partial, body.to_string())
        .and_then(|()| std::fs::rename(&partial, &discovery))
        .map_err(|e| CoreError::io("writing the discovery file", e))?;
    tracing::info!(socket = %config.socket.display(), restored, elapsed_ms = started.elapsed().as_millis() as u64, "Core serving");
    println!("pedelec-core listening on {}", config.socket.display());

    let remove_endpoint = listener.remover();
    let remove_tool_endpoint = tool_listener.remover();
    #[cfg(unix)]
    let (remove_handoff_endpoint, handoff_server) = (
        handoff_listener.remover(),
        tokio::spawn({
            let assets = assets.clone();
            async move { assets.serve_handoff(handoff_listener, &handoff_endpoint).await }
        }),
    );
    let tool_server = tokio::spawn(crate::tool_socket::serve(
        tool_listener,
        AgentToolsService { registry: registry.clone() },
        config.connections.max,
    ));
    let incoming = crate::connections::incoming(listener, config.connections);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        // A connection whose peer stopped answering (half-open) is ended
        // instead of holding its descriptor and slot for ever.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .add_service(pedelec_protocol::with_message_limits!(CoreServer::new(CoreService {
            registry: registry.clone()
        })))
        .add_service(pedelec_protocol::with_message_limits!(CoreRelayServer::new(CoreService {
            registry: registry.clone()
        })))
        .add_service(pedelec_protocol::with_message_limits!(AgentToolsServer::new(AgentToolsService {
            registry: registry.clone()
        })))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    tokio::pin!(server);
    let result = tokio::select! {
        result = &mut server => result,
        _ = signals.wait() => {
            tracing::info!("shutting down");
            // Ending sessions closes their subscription streams, which lets
            // the graceful shutdown finish instead of waiting on idle clients.
            registry.shutdown().await;
            let _ = stop.send(());
            tokio::time::timeout(std::time::Duration::from_secs(5), server).await.unwrap_or(Ok(()))
        }
    };
    tool_server.abort();
    remove_endpoint();
    remove_tool_endpoint();
    #[cfg(unix)]
    {
        handoff_server.abort();
        remove_handoff_endpoint();
    }
    let _ = std::fs::remove_file(&discovery);
    result.map_err(|e| CoreError::new(ErrorCode::Internal, format!("gRPC server failed: {e}")))
}

/// Keeps memory and the store bounded for as long as Core runs: ended
/// sessions nobody holds leave memory (a subscriber that went away, an
/// auto-end after a disconnect), and ended sessions past their retention
/// are deleted (at start, then hourly). When Core has gone quiet after work,
/// it hands back the memory that work left mapped (`platform::memory`).
async fn maintain(
    registry: Arc<Registry>,
    mut released: tokio::sync::mpsc::UnboundedReceiver<String>,
    retention: Option<std::time::Duration>,
    trim_after_quiet: Option<std::time::Duration>,
) {
    let mut evict = tokio::time::interval(crate::registry::EVICTION_INTERVAL);
    let mut purge = tokio::time::interval(crate::registry::RETENTION_INTERVAL);
    evict.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    purge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet_tick = tokio::time::interval(trim_after_quiet.unwrap_or(memory::QUIET_TICK));
    quiet_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet = memory::QuietTrim::default();
    loop {
        tokio::select! {
            Some(id) = released.recv() => {
                registry.evict(&id);
            }
            _ = evict.tick() => {
                let evicted = registry.evict_ended();
                if evicted > 0 {
                    tracing::debug!(evicted, "ended sessions left memory");
                    memory::return_freed_memory();
                }
            }
            _ = quiet_tick.tick(), if trim_after_quiet.is_some() => {
                let (cpu, faults) = memory::usage();
                if quiet.tick(cpu, faults) {
                    let released_kib = memory::trim();
                    let (cpu, faults) = memory::usage();
                    quiet.trimmed(cpu, faults);
                    tracing::debug!(released_kib, "quiet: handed back mapped code pages and free heap");
                }
            }
            _ = purge.tick(), if retention.is_some() => {
                match registry.purge_expired(retention.unwrap_or_default()).await {
                    Ok(0) => {}
                    Ok(deleted) => tracing::info!(deleted, "deleted ended sessions past their retention"),
                    Err(error) => tracing::warn!(%error, "could not delete expired sessions"),
                }
            }
        }
    }
}
