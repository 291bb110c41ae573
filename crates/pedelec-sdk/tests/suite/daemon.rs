//! `pedelec-core serve`: socket, discovery file, single instance, clean exit.

use std::os::unix::fs::PermissionsExt;

use pedelec_sdk::daemon::find_core_binary;

use super::*;

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_and_discovery_file_are_private_and_removed_at_exit() {
    let mut h = Harness::start();
    assert_eq!(mode(&h.socket()), 0o600);
    assert_eq!(mode(h.socket().parent().unwrap()), 0o700);
    let discovery = h.socket().with_file_name("core.json");
    eventually("the discovery file", || discovery.exists()).await;
    let body: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&discovery).unwrap()).unwrap();
    assert_eq!(body["pid"], h.core.pid().unwrap());
    assert_eq!(body["socket"], h.socket().display().to_string());
    let ping = h.client().await.ping().await.unwrap();
    assert_eq!(ping.pid, h.core.pid().unwrap());
    assert!(h.core.terminate());
    assert!(!h.socket().exists());
    assert!(!discovery.exists());
}

/// Eight Cores started at once on one state dir and socket (two native hosts
/// starting Core at the same moment, four times over): exactly one serves;
/// the others exit at once, none is left running on an unlinked socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_eight_cores_racing_for_one_state_dir_exactly_one_serves() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/core.sock");
    let state = dir.path().join("state");
    let mut racers: Vec<std::process::Child> = (0..8)
        .map(|_| {
            std::process::Command::new(find_core_binary())
                .args(["serve", "--socket"])
                .arg(&socket)
                .arg("--state-dir")
                .arg(&state)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // The losers exit on their own; the winner serves until stopped.
    let mut exited = Vec::new();
    for _ in 0..500 {
        exited = racers.iter_mut().map(|c| c.try_wait().unwrap().is_some()).collect();
        if exited.iter().filter(|&&e| e).count() == 7 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(exited.iter().filter(|&&e| !e).count(), 1, "exactly one Core is left running: {exited:?}");
    let winner = exited.iter().position(|&e| !e).unwrap();
    let client = eventually_connect(&socket).await;
    let ping = client.ping().await.expect("the winner serves the socket");
    assert_eq!(ping.pid, racers[winner].id(), "the socket is the running Core's");
    for (i, racer) in racers.iter_mut().enumerate().filter(|(i, _)| *i != winner) {
        let output = racer.wait_with_output_ref();
        assert!(output.contains("already serving"), "racer {i} said: {output}");
    }
    racers[winner].kill().unwrap();
    racers[winner].wait().unwrap();
}

/// Connects once the socket accepts (bounded).
async fn eventually_connect(socket: &std::path::Path) -> Pedelec {
    for _ in 0..500 {
        if let Ok(client) = Pedelec::connect(socket, ORIGIN).await
            && client.ping().await.is_ok()
        {
            return client;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no Core came to serve {}", socket.display());
}

/// Reads what an exited child wrote to its piped stderr.
trait StderrText {
    fn wait_with_output_ref(&mut self) -> String;
}

impl StderrText for std::process::Child {
    fn wait_with_output_ref(&mut self) -> String {
        use std::io::Read;
        let mut text = String::new();
        if let Some(mut stderr) = self.stderr.take() {
            let _ = stderr.read_to_string(&mut text);
        }
        let _ = self.wait();
        text
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_core_refuses_a_live_socket_and_takes_over_a_stale_one() {
    let mut h = Harness::start();
    let out = std::process::Command::new(find_core_binary())
        .args(["serve", "--socket"])
        .arg(h.socket())
        .arg("--state-dir")
        .arg(h.dir.path().join("other-state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already serving"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    h.client().await.ping().await.expect("the first Core is undisturbed");

    h.core.kill();
    assert!(h.socket().exists(), "a crash leaves the socket behind");
    h.restart();
    h.client().await.ping().await.expect("the stale socket was taken over");
}

/// Core raises its soft open-file limit to the hard one at start: the
/// default soft limit is what a thousand idle connections exhaust.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_raises_its_open_file_limit_to_the_hard_limit() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/core.sock");
    let script = format!(
        "ulimit -Sn 64 && exec {} serve --socket {} --state-dir {}",
        find_core_binary().display(),
        socket.display(),
        dir.path().join("state").display()
    );
    let mut core =
        std::process::Command::new("sh").args(["-c", &script]).stdout(std::process::Stdio::null()).spawn().unwrap();
    let client = eventually_connect(&socket).await;
    let pid = client.ping().await.unwrap().pid;
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_owned();
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    core.kill().unwrap();
    core.wait().unwrap();
    assert_eq!(numbers[0], numbers[1], "soft raised from 64 to the hard limit: {line}");
}

/// `pedelec-core doctor` against a running Core and a home with one good
/// and one broken native-host registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_says_what_answers_what_is_available_and_what_is_registered() {
    let h = Harness::start();
    let home = tempfile::tempdir().unwrap();
    let host = home.path().join("bin/pedelec-native-host");
    std::fs::create_dir_all(host.parent().unwrap()).unwrap();
    std::fs::write(&host, "").unwrap();
    let register = |dir: &str, binary: &std::path::Path| {
        let dir = home.path().join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = json!({ "name": "dev.pedelec.host", "path": binary.display().to_string(), "type": "stdio",
                               "allowed_origins": ["chrome-extension://ighbaanpnpjegfpbhfnaekbncchadgfe/"] });
        std::fs::write(dir.join("dev.pedelec.host.json"), manifest.to_string()).unwrap();
    };
    register(".config/chromium/NativeMessagingHosts", &host);
    register(".config/google-chrome/NativeMessagingHosts", &home.path().join("gone/pedelec-native-host"));
    let output = std::process::Command::new(pedelec_sdk::daemon::find_core_binary())
        .arg("doctor")
        .arg("--socket")
        .arg(h.socket())
        .arg("--state-dir")
        .arg(h.state())
        .arg("--config-dir")
        .arg(h.dir.path().join("config"))
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .output()
        .expect("the doctor runs");
    assert!(output.status.success());
    let report = String::from_utf8(output.stdout).unwrap();
    let line = |start: &str| report.lines().find(|l| l.trim_start().starts_with(start)).unwrap_or_default().to_owned();
    assert!(line("✓ socket").contains("answers: Core"), "{report}");
    // The setting a stock grpcio client needs, for this very socket (the
    // interop test's Python client connects with exactly it).
    let setting = r#"options=[("grpc.default_authority", "localhost")]"#;
    let clients = line("· clients");
    assert!(clients.contains(&format!("unix://{}", h.socket().display())) && clients.contains(setting), "{report}");
    assert!(line("✓ state dir").contains("700"), "{report}");
    assert!(report.contains("(as the running Core sees them)"), "{report}");
    assert!(line("✓ scripted").contains("Scripted"), "{report}");
    assert!(line("✗ codex ").contains("not on PATH") || line("✓ codex ").contains("Codex"), "{report}");
    // The same detection as the control center's Agents view (ListAgents):
    // version, default model, the default, and how to install a missing agent.
    let scripted = line("✓ scripted");
    assert!(
        scripted.contains(env!("CARGO_PKG_VERSION")) && scripted.contains("· model scripted-1 · the default"),
        "{report}"
    );
    assert!(
        line("✓ codex ").contains("Codex") || line("✗ codex ").ends_with("(install: npm install -g @openai/codex)"),
        "{report}"
    );
    assert!(line("✓ chromium").contains(&host.display().to_string()), "{report}");
    assert!(line("✓ chromium").contains("ighbaanpnpjegfpbhfnaekbncchadgfe"), "{report}");
    assert!(line("✗ chrome ").contains("MISSING"), "{report}");
    assert!(line("- firefox").contains("not registered"), "{report}");

    // With Core gone, the doctor says so and still lists the providers from the settings.
    drop(h);
    let state = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(pedelec_sdk::daemon::find_core_binary())
        .args(["doctor", "--socket"])
        .arg(state.path().join("core.sock"))
        .arg("--state-dir")
        .arg(state.path())
        .env("HOME", home.path())
        .output()
        .unwrap();
    let report = String::from_utf8(output.stdout).unwrap();
    assert!(report.contains("✗ socket") && report.contains("not running"), "{report}");
    assert!(report.contains("(from the settings; Core is not answering)"), "{report}");
}

/// KiB of Core's own binary that its page tables map (`Rss` of the
/// binary's mappings in smaps).
#[cfg(target_os = "linux")]
fn mapped_binary_kib(pid: u32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut ours = false;
    let mut kib = 0;
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if ours {
                kib += rss.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap();
            }
        } else if line.contains(" r") && line.split_whitespace().next().is_some_and(|range| range.contains('-')) {
            ours = line.ends_with(&*exe.to_string_lossy());
        }
    }
    kib
}

/// KiB of anonymous memory resident in the process (`RssAnon`).
#[cfg(target_os = "linux")]
fn anonymous_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("RssAnon:")).expect("RssAnon in /proc/<pid>/status");
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

/// A quiet Core hands back the pages of its binary that start-up mapped
/// (`platform::memory`), and the code it runs next comes back: a tool turn
/// after the trim is answered as before. A Core started with
/// `--trim-after-quiet-ms 0`, alongside, keeps them.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_core_hands_back_the_code_it_mapped_and_still_serves() {
    let keeper_dir = tempfile::tempdir().unwrap();
    let keeper_socket = keeper_dir.path().join("core.sock");
    let _keeper = CoreProcess::spawn_with_args(
        &find_core_binary(),
        &keeper_socket,
        &keeper_dir.path().join("state"),
        Duration::from_secs(3),
        &["--trim-after-quiet-ms", "0"],
    )
    .unwrap();
    let keeper_pid = Pedelec::connect(&keeper_socket, ORIGIN).await.unwrap().ping().await.unwrap().pid;
    let kept = mapped_binary_kib(keeper_pid);
    let h = Harness::start();
    let client = h.client().await;
    let pid = client.ping().await.unwrap().pid;
    let started = mapped_binary_kib(pid);
    let mut now = started;
    for _ in 0..100 {
        now = mapped_binary_kib(pid);
        if now * 2 < started {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(now * 2 < started, "mapped {started} KiB of its binary after start and still {now} KiB after 10 s");
    let keeper_now = mapped_binary_kib(keeper_pid);
    assert!(keeper_now * 4 >= kept * 3, "the Core without the trim went from {kept} to {keeper_now} KiB");
    // Its heap is small too: the allocator commits on demand
    // (`platform::memory::configure_allocator`). Committed eagerly, an idle
    // Core held ~11 MiB of anonymous memory; on demand ~1.7 MiB.
    let anon = anonymous_kib(pid);
    assert!(anon < 6 * 1024, "an idle Core holds {anon} KiB of anonymous memory");

    let (session, counter) = counter_session(&client).await;
    let recorder = Recorder::attach(&session);
    session.send_text("/tool update_counter {\"delta\": 5}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 5);
    assert!(recorder.lines().iter().any(|l| l.starts_with("chat ")), "the turn answered: {:?}", recorder.lines());
    assert!(mapped_binary_kib(pid) > now, "the code the turn ran was mapped again");
}
