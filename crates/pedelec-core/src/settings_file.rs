//! Writing the user's settings (`Core.SetSettings`, from the control
//! center) into `config.toml`: the change is made in the file's own text
//! (every other line and comment kept), the result is checked exactly as
//! Core checks the file at start, and only a file that passes replaces the
//! old one, atomically (a temporary file beside it, synced, then renamed).

use std::io::Write;
use std::path::Path;

use pedelec_protocol::{ErrorCode, limits};

use crate::error::{CoreError, CoreResult};
use crate::providers::Providers;
use crate::settings::{Settings, SettingsChange};

/// A config.toml larger than this is not edited (it is hand-written and small).
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Providers one change may touch.
pub const MAX_MODEL_CHANGES: usize = 64;

/// Checks what a change names against the providers Core runs now:
/// known provider codes, model names as `SetModel` takes them.
pub fn check(change: &SettingsChange, providers: &Providers) -> CoreResult<()> {
    let invalid = |message: String| CoreError::new(ErrorCode::InvalidArgument, message);
    if change.models.len() > MAX_MODEL_CHANGES {
        return Err(invalid(format!("at most {MAX_MODEL_CHANGES} models per change")));
    }
    let unknown = |code: &str| {
        CoreError::with_details(
            ErrorCode::ProviderNotFound,
            format!("no provider {code:?}"),
            serde_json::json!({ "provider": code }),
        )
    };
    if let Some(code) = &change.default_provider
        && providers.get(code).is_none()
    {
        return Err(unknown(code));
    }
    for (code, model) in &change.models {
        if providers.get(code).is_none() {
            return Err(unknown(code));
        }
        if let Some(problem) = model.as_deref().and_then(limits::model_name_problem) {
            return Err(invalid(format!("providers.{code}.model: {problem}")));
        }
    }
    Ok(())
}

/// Makes `change` in the config file at `path` and returns the providers
/// the new file gives. Nothing is written when the result would not load.
pub fn apply(path: &Path, change: &SettingsChange) -> CoreResult<Providers> {
    let invalid = |message: String| {
        CoreError::new(ErrorCode::ConfigInvalid, format!("{}: {message} (the file is unchanged)", path.display()))
    };
    let text = match std::fs::metadata(path) {
        Ok(meta) if meta.len() > MAX_CONFIG_BYTES => {
            return Err(invalid(format!("larger than {MAX_CONFIG_BYTES} bytes")));
        }
        Ok(_) => std::fs::read_to_string(path).map_err(|e| invalid(format!("cannot read it: {e}")))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(invalid(format!("cannot read it: {e}"))),
    };
    let edited = Settings::edited(&text, change).map_err(invalid)?;
    let settings = Settings::parse(&edited).map_err(invalid)?;
    let providers = Providers::from_settings(&settings)?;
    write_atomically(path, &edited).map_err(|e| CoreError::io("writing config.toml", e))?;
    Ok(providers)
}

/// `text` as the file at `path`, or the old file untouched.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(".config.toml.pedelec-new");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&temporary)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)?;
    // The rename itself is durable once the folder is.
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(default: Option<&str>, models: &[(&str, Option<&str>)]) -> SettingsChange {
        SettingsChange {
            default_provider: default.map(str::to_owned),
            models: models.iter().map(|(c, m)| (c.to_string(), m.map(str::to_owned))).collect(),
        }
    }

    #[test]
    fn a_change_keeps_the_files_comments_and_other_settings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let before = "# my settings\nturn_timeout_secs = 900 # long turns\n\n[providers.codex]\n# pinned\ncommand = [\"/opt/codex\"]\n";
        std::fs::write(&path, before).unwrap();
        let providers =
            apply(&path, &change(Some("codex"), &[("codex", Some("gpt-5.4")), ("claude", Some("opus"))])).unwrap();
        let after = std::fs::read_to_string(&path).unwrap();
        assert!(after.starts_with("# my settings\nturn_timeout_secs = 900 # long turns\n"), "{after}");
        assert!(after.contains("# pinned\ncommand = [\"/opt/codex\"]\nmodel = \"gpt-5.4\""), "{after}");
        assert!(after.contains("default_provider = \"codex\""), "{after}");
        assert!(after.contains("[providers.claude]\nmodel = \"opus\""), "{after}");
        assert_eq!(providers.default_code(), "codex");
        assert_eq!(providers.default_models()["claude"], "opus");
        // Removing a model brings the preset back.
        apply(&path, &change(None, &[("claude", None)])).unwrap();
        let again = std::fs::read_to_string(&path).unwrap();
        assert!(!again.contains("opus"), "{again}");
    }

    #[test]
    fn a_change_that_would_not_load_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        // A file Core would refuse at start is never made by an edit.
        let broken = "turn_timeout_secs = 0\n";
        std::fs::write(&path, broken).unwrap();
        let Err(error) = apply(&path, &change(Some("scripted"), &[])) else { panic!("a broken file was edited") };
        assert_eq!(error.code(), ErrorCode::ConfigInvalid);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), broken, "unchanged");
        std::fs::write(&path, "not = [toml").unwrap();
        let Err(error) = apply(&path, &change(Some("scripted"), &[])) else { panic!("not TOML, yet edited") };
        assert_eq!(error.code(), ErrorCode::ConfigInvalid);
    }

    #[test]
    fn unknown_providers_and_bad_models_are_refused() {
        let providers = Providers::builtin();
        assert_eq!(check(&change(Some("nope"), &[]), &providers).unwrap_err().code(), ErrorCode::ProviderNotFound);
        assert_eq!(
            check(&change(None, &[("nope", Some("m"))]), &providers).unwrap_err().code(),
            ErrorCode::ProviderNotFound
        );
        for bad in ["", "-flag", "a\nb"] {
            let error = check(&change(None, &[("scripted", Some(bad))]), &providers).unwrap_err();
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{bad:?}");
        }
        assert!(check(&change(Some("scripted"), &[("scripted", None)]), &providers).is_ok());
    }
}
