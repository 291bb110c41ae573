//! The folder picker (issue 42): the user lists their folders through
//! Core (`Owner::list_folders`, Core's `ListFolders`), picks one for a site
//! (`Owner::pick_folder`), and the site opens a session there by the opaque
//! handle alone, never learning the path above the folder. Over both
//! transports; a web origin is refused both calls.

use std::path::{Path, PathBuf};

use pedelec_sdk::ErrorCode;
use pedelec_sdk::transport::{Call, Reply};

use super::*;

const SITE: &str = "https://picker.example";
const OTHER: &str = "https://other.example";

/// A home directory for Core with a project, a hidden folder, a secret
/// store, a file and a link to the secret store.
fn home() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().canonicalize().unwrap().join("home");
    for sub in ["projects/app/src", "projects/blog", ".cache", ".ssh"] {
        std::fs::create_dir_all(home.join(sub)).unwrap();
    }
    std::fs::write(home.join("notes.txt"), "a file").unwrap();
    std::os::unix::fs::symlink(home.join(".ssh"), home.join("projects/keys")).unwrap();
    (dir, home)
}

fn harness(via: Via, home: &Path) -> Harness {
    Harness::with_config_env(via, "", &[("HOME", &home.display().to_string())])
}

fn code(error: &pedelec_sdk::PedelecError) -> &str {
    error.code.as_str()
}

fn reason(error: &pedelec_sdk::PedelecError) -> String {
    let details = error.details.clone().unwrap_or_default();
    details["reason"].as_str().unwrap_or_default().to_owned()
}

async fn the_user_lists_folders_marked_as_the_policy_judges_them(via: Via) {
    let (_dir, home) = home();
    let h = harness(via, &home);
    let owner = h.client_for(OWNER).await.owner().unwrap();

    // Empty: the home directory, which itself may never be picked.
    let top = owner.list_folders("", false).await.unwrap();
    assert_eq!((top.path.as_str(), top.home.as_str()), (home.to_str().unwrap(), home.to_str().unwrap()));
    assert_eq!((top.pickable, top.reason.as_str()), (false, "forbidden"));
    let names: Vec<&str> = top.folders.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["projects"], "no hidden folders, no files");
    let hidden = owner.list_folders("", true).await.unwrap();
    let marks: Vec<(&str, bool, &str)> =
        hidden.folders.iter().map(|f| (f.name.as_str(), f.pickable, f.reason.as_str())).collect();
    assert_eq!(marks, [(".cache", true, ""), (".ssh", false, "forbidden"), ("projects", true, "")]);

    // A link is listed as one, never followed, never pickable.
    let projects = owner.list_folders(home.join("projects").to_str().unwrap(), false).await.unwrap();
    let marks: Vec<(&str, bool, bool, &str)> =
        projects.folders.iter().map(|f| (f.name.as_str(), f.link, f.pickable, f.reason.as_str())).collect();
    assert_eq!(marks, [("app", false, true, ""), ("blog", false, true, ""), ("keys", true, false, "link")]);
    assert!(projects.pickable && !projects.truncated);
    assert_eq!(projects.parent, home.display().to_string());

    // Bad input: each refusal with its code.
    let too_long = format!("/{}", "a".repeat(5000));
    for bad in ["projects", "/tmp/a\0b", too_long.as_str()] {
        let error = owner.list_folders(bad, false).await.unwrap_err();
        assert_eq!(code(&error), "INVALID_ARGUMENT", "{bad:?}: {error:?}");
    }
    for missing in [home.join("nothing-here"), home.join("notes.txt")] {
        let error = owner.list_folders(missing.to_str().unwrap(), false).await.unwrap_err();
        assert_eq!(code(&error), "WORKSPACE_INVALID", "{}", missing.display());
    }
    let error = owner.list_folders(home.join(".ssh").to_str().unwrap(), true).await.unwrap_err();
    assert_eq!((code(&error), reason(&error).as_str()), ("WORKSPACE_NOT_ALLOWED", "forbidden"));
    // Listing granted nothing.
    assert!(h.raw().await.get_consent(consent_of(SITE)).await.unwrap().into_inner().origins.is_empty());
}

fn consent_of(origin: &str) -> pb::GetConsentRequest {
    pb::GetConsentRequest { caller_origin: OWNER.into(), origin: origin.into() }
}

async fn a_picked_folder_opens_by_its_handle_for_its_origin_only(via: Via) {
    let (_dir, home) = home();
    let h = harness(via, &home);
    let site = h.client_for(SITE).await;
    let other = h.client_for(OTHER).await;
    let owner = h.client_for(OWNER).await.owner().unwrap();
    let app = home.join("projects/app");

    let picked = owner.pick_folder(SITE, app.to_str().unwrap()).await.unwrap();
    assert_eq!(picked.name, "app");
    assert!(picked.handle.starts_with("wsh-") && picked.handle.len() == 36, "{}", picked.handle);
    let grant = picked.grant.clone().unwrap();
    assert_eq!((grant.path.as_str(), grant.may_approve_commands), (app.to_str().unwrap(), false));
    // Picking it again keeps the grant and its handle.
    assert_eq!(owner.pick_folder(SITE, app.to_str().unwrap()).await.unwrap().handle, picked.handle);
    let stored = h.raw().await.get_consent(consent_of(SITE)).await.unwrap().into_inner().origins;
    assert_eq!(stored[0].folders, vec![grant]);
    assert!(stored[0].approved, "the approval is untouched");

    // Never-allowed folders and bad input are refused, changing nothing.
    for (path, expected) in [
        (home.clone(), "WORKSPACE_NOT_ALLOWED"),
        (home.join(".ssh"), "WORKSPACE_NOT_ALLOWED"),
        (home.join("projects/keys"), "WORKSPACE_NOT_ALLOWED"),
        (home.join("notes.txt"), "WORKSPACE_INVALID"),
        (PathBuf::from("projects/app"), "WORKSPACE_INVALID"),
    ] {
        let error = owner.pick_folder(SITE, path.to_str().unwrap()).await.unwrap_err();
        assert_eq!(code(&error), expected, "{}", path.display());
    }
    let error = owner.pick_folder("app:not-a-site", app.to_str().unwrap()).await.unwrap_err();
    assert_eq!(code(&error), "INVALID_ARGUMENT");
    let stored_again = h.raw().await.get_consent(consent_of(SITE)).await.unwrap().into_inner().origins;
    assert_eq!(stored_again, stored);

    // The site opens a session there by the handle, and its agent works there.
    let session = site
        .create_session::<String>(SessionOptions {
            workspace_handle: Some(picked.handle.clone()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    session.send_text("/write picked.txt hello from the picker").await.unwrap();
    assert_eq!(std::fs::read_to_string(app.join("picked.txt")).unwrap(), "hello from the picker");
    // The site is told the folder's name, never the path above it; the user sees it all.
    let listed = h
        .raw()
        .await
        .list_sessions(pb::ListSessionsRequest { caller_origin: SITE.into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let info = listed.sessions[0].session.clone().unwrap();
    assert_eq!((info.workspace_path.as_str(), info.managed_workspace), ("app", false));
    let live = owner.live_sessions(Some(SITE)).await.unwrap();
    assert_eq!(live[0].workspace_path, app.display().to_string());
    // A typed path inside the picked folder still works, shown from the folder's name.
    let typed = site
        .create_session::<String>(SessionOptions {
            workspace_path: Some(app.join("src")),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    typed.send_text("/write typed.txt ok").await.unwrap();
    assert!(app.join("src/typed.txt").is_file());

    // Another origin's handle, a made-up one, and a path with a handle are refused.
    let refused = |handle: &str, path: Option<PathBuf>| SessionOptions::<String> {
        workspace_handle: Some(handle.to_owned()),
        workspace_path: path,
        auto_end_on_disconnect: false,
        ..Default::default()
    };
    let error = other.create_session(refused(&picked.handle, None)).await.unwrap_err();
    assert_eq!((code(&error), reason(&error).as_str()), ("WORKSPACE_NOT_ALLOWED", "unknown_handle"));
    assert!(!error.message.contains(app.to_str().unwrap()), "no path is told: {error:?}");
    for made_up in ["wsh-00000000000000000000000000000000", "wsh-nope", "../../etc"] {
        let error = site.create_session(refused(made_up, None)).await.unwrap_err();
        assert_eq!((code(&error), reason(&error).as_str()), ("WORKSPACE_NOT_ALLOWED", "unknown_handle"), "{made_up}");
    }
    let error = site.create_session(refused(&picked.handle, Some(app.clone()))).await.unwrap_err();
    assert_eq!(code(&error), "INVALID_ARGUMENT");

    // Withdrawn, the handle opens nothing; a new pick mints a new one.
    h.approve(SITE, &[]).await;
    let error = site.create_session(refused(&picked.handle, None)).await.unwrap_err();
    assert_eq!((code(&error), reason(&error).as_str()), ("WORKSPACE_NOT_ALLOWED", "unknown_handle"));
    let error = session.send_text("/write late.txt no").await.unwrap_err();
    assert_eq!(code(&error), "WORKSPACE_NOT_ALLOWED");
    assert!(!error.message.contains(app.to_str().unwrap()), "{error:?}");
    let again = owner.pick_folder(SITE, app.to_str().unwrap()).await.unwrap();
    assert_ne!(again.handle, picked.handle);
    assert!(site.create_session(refused(&again.handle, None)).await.is_ok());
}

async fn a_handle_survives_a_restart_and_a_page_cannot_pick(via: Via) {
    let (_dir, home) = home();
    let mut h = harness(via, &home);
    let owner = h.client_for(OWNER).await.owner().unwrap();
    let blog = home.join("projects/blog");
    h.approve(SITE, &[]).await;
    let picked = owner.pick_folder(SITE, blog.to_str().unwrap()).await.unwrap();
    h.crash_and_restart();
    let site = pedelec_sdk::Pedelec::with_transport(h.transport().await, SITE);
    let session = site
        .create_session::<String>(SessionOptions {
            workspace_handle: Some(picked.handle.clone()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .expect("the handle is stored with the consent");
    session.send_text("/write kept.txt yes").await.unwrap();
    assert!(blog.join("kept.txt").is_file());

    // A page (any web origin) is refused both calls, whatever it names.
    let transport = h.transport().await;
    for caller in [SITE, "http://localhost:8080", ""] {
        let list = pb::ListFoldersRequest { caller_origin: caller.into(), ..Default::default() };
        let error = transport.call(Call::ListFolders(list)).await.unwrap_err();
        assert!(error.is(ErrorCode::OriginNotAllowed), "{caller:?}: {error:?}");
        assert_eq!(reason(&error), "owner_only");
        let pick = pb::PickFolderRequest {
            caller_origin: caller.into(),
            origin: SITE.into(),
            path: home.join("projects/app").display().to_string(),
        };
        let error = transport.call(Call::PickFolder(pick)).await.unwrap_err();
        assert!(error.is(ErrorCode::OriginNotAllowed), "{caller:?}: {error:?}");
    }
    let list = pb::ListFoldersRequest { caller_origin: OWNER.into(), ..Default::default() };
    assert!(matches!(transport.call(Call::ListFolders(list)).await, Ok(Reply::ListFolders(_))));
    let stored = h.raw().await.get_consent(consent_of(SITE)).await.unwrap().into_inner().origins;
    assert_eq!(stored[0].folders.len(), 1, "the refused picks granted nothing");
}

super::over_both_transports!(
    the_user_lists_folders_marked_as_the_policy_judges_them,
    a_picked_folder_opens_by_its_handle_for_its_origin_only,
    a_handle_survives_a_restart_and_a_page_cannot_pick,
);
