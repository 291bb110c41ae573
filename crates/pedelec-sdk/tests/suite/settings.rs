//! `Owner::set_settings` (Core.SetSettings): the default agent and models
//! the user chooses are written into Core's config.toml, its other lines
//! kept, take effect for the next session at once and survive a restart;
//! sites cannot call it, and a bad change writes nothing.

use std::collections::HashMap;

use pedelec_protocol::pb;
use pedelec_sdk::SessionOptions;

use super::{Harness, OWNER, Via};

async fn the_users_settings_land_in_config_toml(via: Via) {
    let mut h = Harness::with_config(via, "# my settings\nturn_timeout_secs = 300\n");
    let file = h.dir.path().join("config/config.toml");
    let owner = h.client_for(OWNER).await.owner().unwrap();
    let models = HashMap::from([("scripted".to_owned(), "scripted-text-only".to_owned())]);
    let settings = owner.set_settings(Some("scripted"), models).await.expect("set_settings");
    assert_eq!(settings.default_models["scripted"], "scripted-text-only");
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains("# my settings\n") && written.contains("turn_timeout_secs = 300"), "{written}");
    assert!(written.contains("[providers.scripted]\nmodel = \"scripted-text-only\""), "{written}");
    // The next session runs the new default model, without a restart.
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    let listed = client.list_sessions().await.unwrap();
    let info = listed.iter().find_map(|s| s.session.as_ref().filter(|i| i.session_id == session.session_id())).unwrap();
    assert_eq!(info.model, "scripted-text-only");
    // Kept across a restart: it is Core's config now.
    drop(owner);
    h.crash_and_restart();
    let settings = h.client().await.get_settings().await.unwrap();
    assert_eq!(settings.default_models["scripted"], "scripted-text-only");
}

async fn bad_settings_and_sites_change_nothing(via: Via) {
    let h = Harness::with_config(via, "turn_timeout_secs = 300 # mine\n");
    let file = h.dir.path().join("config/config.toml");
    let before = std::fs::read_to_string(&file).unwrap();
    let owner = h.client_for(OWNER).await.owner().unwrap();
    let one = |code: &str, model: &str| HashMap::from([(code.to_owned(), model.to_owned())]);
    let unknown = owner.set_settings(Some("no-such-agent"), HashMap::new()).await.unwrap_err();
    assert_eq!(unknown.code, "PROVIDER_NOT_FOUND", "{unknown:?}");
    assert_eq!(owner.set_settings(None, one("nope", "m")).await.unwrap_err().code, "PROVIDER_NOT_FOUND");
    for bad in ["--dangerously-skip-permissions", "a\nb", &"m".repeat(129)] {
        let error = owner.set_settings(None, one("scripted", bad)).await.unwrap_err();
        assert_eq!(error.code, "INVALID_ARGUMENT", "{bad:.20}: {error:?}");
    }
    let many: HashMap<String, String> = (0..65).map(|i| (format!("p{i}"), "m".to_owned())).collect();
    assert_eq!(owner.set_settings(None, many).await.unwrap_err().code, "INVALID_ARGUMENT");
    // A site cannot change Core's settings.
    let mut raw = h.raw().await;
    let request = pb::SetSettingsRequest {
        caller_origin: "https://evil.example".into(),
        default_provider: "scripted".into(),
        ..Default::default()
    };
    let status = raw.set_settings(request).await.unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&status).code, "ORIGIN_NOT_ALLOWED");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before, "nothing was written");
}

super::over_both_transports!(the_users_settings_land_in_config_toml, bad_settings_and_sites_change_nothing);
