//! Public asset paths (`/results/report.json`) and their validation.
//!
//! A public path names a file below a session's `assets/` directory. It must
//! begin with `/`, use forward slashes only, and contain no empty, `.` or `..`
//! segment, no backslash, NUL or control character; its length and depth are
//! bounded. An accepted path therefore always stays below its root when joined.
//!
//! # Examples
//!
//! ```
//! use std::path::Path;
//! use pedelec_protocol::{AssetPath, AssetPathError};
//!
//! let path = AssetPath::parse("/results/report.json").unwrap();
//! assert_eq!(path.join_to(Path::new("/srv/assets")), Path::new("/srv/assets/results/report.json"));
//! // Nothing that could climb out of the root is accepted.
//! assert_eq!(AssetPath::parse("/../etc/passwd"), Err(AssetPathError::DotSegment));
//! ```

use std::path::{Path, PathBuf};

use crate::limits::{MAX_ASSET_PATH_BYTES, MAX_ASSET_PATH_SEGMENTS};

/// A validated public asset path.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::AssetPath;
///
/// let path: AssetPath = "/screens/page.png".parse().unwrap();
/// assert_eq!(path.to_string(), "/screens/page.png");
/// assert_eq!(path.file_name(), "page.png");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AssetPath(String);

/// Why a public asset path was refused.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::{AssetPath, AssetPathError};
///
/// assert_eq!(AssetPath::parse("report.txt"), Err(AssetPathError::NotAbsolute));
/// assert_eq!(AssetPath::parse("/a//b"), Err(AssetPathError::EmptySegment));
/// assert_eq!(AssetPathError::Backslash.to_string(), "asset path contains a backslash");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssetPathError {
    #[error("asset path must begin with '/'")]
    NotAbsolute,
    #[error("asset path is longer than {MAX_ASSET_PATH_BYTES} bytes")]
    TooLong,
    #[error("asset path has more than {MAX_ASSET_PATH_SEGMENTS} segments")]
    TooDeep,
    #[error("asset path has an empty segment")]
    EmptySegment,
    #[error("asset path has a '.' or '..' segment")]
    DotSegment,
    #[error("asset path contains a backslash")]
    Backslash,
    #[error("asset path contains a NUL or control character")]
    ControlCharacter,
}

impl AssetPath {
    /// Parses and validates a public path.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{AssetPath, AssetPathError};
    ///
    /// assert!(AssetPath::parse("/a b/ü.txt").is_ok());
    /// assert_eq!(AssetPath::parse("/a\\b"), Err(AssetPathError::Backslash));
    /// assert_eq!(AssetPath::parse("/a\nb"), Err(AssetPathError::ControlCharacter));
    /// ```
    pub fn parse(text: &str) -> Result<Self, AssetPathError> {
        if text.len() > MAX_ASSET_PATH_BYTES {
            return Err(AssetPathError::TooLong);
        }
        let rest = text.strip_prefix('/').ok_or(AssetPathError::NotAbsolute)?;
        if text.chars().any(char::is_control) {
            return Err(AssetPathError::ControlCharacter);
        }
        if text.contains('\\') {
            return Err(AssetPathError::Backslash);
        }
        let mut count = 0;
        for segment in rest.split('/') {
            count += 1;
            match segment {
                "" => return Err(AssetPathError::EmptySegment),
                "." | ".." => return Err(AssetPathError::DotSegment),
                _ => {}
            }
        }
        if count > MAX_ASSET_PATH_SEGMENTS {
            return Err(AssetPathError::TooDeep);
        }
        Ok(AssetPath(text.to_owned()))
    }

    /// The public form, e.g. `/results/report.json`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::AssetPath;
    ///
    /// assert_eq!(AssetPath::parse("/results/report.json").unwrap().as_str(), "/results/report.json");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The segments below the root.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::AssetPath;
    ///
    /// let path = AssetPath::parse("/results/2024/report.json").unwrap();
    /// assert_eq!(path.segments().collect::<Vec<_>>(), ["results", "2024", "report.json"]);
    /// ```
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0[1..].split('/')
    }

    /// The last segment.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::AssetPath;
    ///
    /// assert_eq!(AssetPath::parse("/results/report.json").unwrap().file_name(), "report.json");
    /// ```
    pub fn file_name(&self) -> &str {
        self.segments().last().unwrap_or_default()
    }

    /// Whether any segment's basename starts with `.pedelec-` (Core's own files).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::AssetPath;
    ///
    /// assert!(AssetPath::parse("/a/.pedelec-upload-1").unwrap().is_reserved());
    /// assert!(!AssetPath::parse("/.hidden").unwrap().is_reserved());
    /// ```
    pub fn is_reserved(&self) -> bool {
        self.segments().any(|s| s.starts_with(".pedelec-"))
    }

    /// The physical path below `root`. Never leaves `root`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::path::Path;
    /// use pedelec_protocol::AssetPath;
    ///
    /// let root = Path::new("/srv/assets");
    /// let file = AssetPath::parse("/results/report.json").unwrap().join_to(root);
    /// assert_eq!(file, root.join("results").join("report.json"));
    /// ```
    pub fn join_to(&self, root: &Path) -> PathBuf {
        let mut out = root.to_path_buf();
        for segment in self.segments() {
            out.push(segment);
        }
        out
    }

    /// The public path of a file found below `root`, when it is expressible.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::path::Path;
    /// use pedelec_protocol::AssetPath;
    ///
    /// let path = AssetPath::from_relative(Path::new("results/report.json")).unwrap();
    /// assert_eq!(path.as_str(), "/results/report.json");
    /// // A path that leaves its root has no public form.
    /// assert_eq!(AssetPath::from_relative(Path::new("../secret")), None);
    /// ```
    pub fn from_relative(relative: &Path) -> Option<Self> {
        let mut text = String::new();
        for component in relative.components() {
            match component {
                std::path::Component::Normal(part) => {
                    text.push('/');
                    text.push_str(part.to_str()?);
                }
                _ => return None,
            }
        }
        Self::parse(&text).ok()
    }
}

impl std::fmt::Display for AssetPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for AssetPath {
    type Err = AssetPathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Whether a file of this MIME type goes as image content when attached
/// (the formats every image-taking provider accepts).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::asset_path::is_attachable_image;
///
/// assert!(is_attachable_image("image/png"));
/// // An SVG is attached as a file, not as image content.
/// assert!(!is_attachable_image("image/svg+xml"));
/// ```
pub fn is_attachable_image(mime: &str) -> bool {
    matches!(mime, "image/png" | "image/jpeg" | "image/gif" | "image/webp")
}

/// Checks a `SendText`'s attachment list before anything is sent (the SDK
/// locally, Core again): at most [`crate::limits::MAX_ATTACHMENTS`], each a
/// valid public path, no path twice.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::ErrorCode;
/// use pedelec_protocol::asset_path::check_attachments;
///
/// assert!(check_attachments(&["/a.png".into(), "/notes/b.txt".into()]).is_ok());
/// let twice = check_attachments(&["/a.png".into(), "/a.png".into()]);
/// assert_eq!(twice.unwrap_err().0, ErrorCode::InvalidArgument);
/// let relative = check_attachments(&["a.png".into()]);
/// assert_eq!(relative.unwrap_err().0, ErrorCode::AssetPathInvalid);
/// ```
pub fn check_attachments(paths: &[String]) -> Result<(), (crate::ErrorCode, String)> {
    if paths.len() > crate::limits::MAX_ATTACHMENTS {
        return Err((
            crate::ErrorCode::InvalidArgument,
            format!("at most {} attachments per text, not {}", crate::limits::MAX_ATTACHMENTS, paths.len()),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for path in paths {
        let parsed = AssetPath::parse(path).map_err(|e| {
            let shown: String = path.chars().take(200).collect();
            (crate::ErrorCode::AssetPathInvalid, format!("attachment {shown:?}: {e}"))
        })?;
        if !seen.insert(parsed.as_str().to_owned()) {
            return Err((crate::ErrorCode::InvalidArgument, format!("attachment {path:?} is listed twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_ordinary_paths() {
        for p in ["/report.txt", "/results/report.json", "/.hidden", "/a b/ü.txt", "/.dir/x"] {
            assert_eq!(AssetPath::parse(p).unwrap().as_str(), p);
        }
        assert_eq!(AssetPath::parse("/results/report.json").unwrap().file_name(), "report.json");
    }

    #[test]
    fn refuses_each_rule() {
        use AssetPathError::*;
        let cases = [
            ("report.txt", NotAbsolute),
            ("", NotAbsolute),
            ("/", EmptySegment),
            ("/a//b", EmptySegment),
            ("/a/", EmptySegment),
            ("/./a", DotSegment),
            ("/a/..", DotSegment),
            ("/../etc/passwd", DotSegment),
            ("/a\\b", Backslash),
            ("/a\0b", ControlCharacter),
            ("/a\nb", ControlCharacter),
            ("/a\u{7f}", ControlCharacter),
        ];
        for (input, expected) in cases {
            assert_eq!(AssetPath::parse(input), Err(expected), "{input:?}");
        }
        assert_eq!(AssetPath::parse(&format!("/{}", "a".repeat(MAX_ASSET_PATH_BYTES))), Err(TooLong));
        assert_eq!(AssetPath::parse(&"/a".repeat(MAX_ASSET_PATH_SEGMENTS + 1)), Err(TooDeep));
        assert!(AssetPath::parse(&"/a".repeat(MAX_ASSET_PATH_SEGMENTS)).is_ok());
    }

    #[test]
    fn reserved_names_are_detected_at_every_level() {
        assert!(AssetPath::parse("/.pedelec-upload").unwrap().is_reserved());
        assert!(AssetPath::parse("/a/.pedelec-x/b").unwrap().is_reserved());
        assert!(!AssetPath::parse("/a/.pedelecx").unwrap().is_reserved());
    }

    #[test]
    fn relative_paths_map_back() {
        let p = AssetPath::from_relative(Path::new("results/r.json")).unwrap();
        assert_eq!(p.as_str(), "/results/r.json");
        assert!(AssetPath::from_relative(Path::new("../x")).is_none());
    }

    proptest! {
        #[test]
        fn no_accepted_path_escapes_its_root(input in "[/a-z.\\\\\u{0}-\u{1f} ]{0,40}") {
            if let Ok(path) = AssetPath::parse(&input) {
                let root = Path::new("/srv/assets");
                let joined = path.join_to(root);
                prop_assert!(joined.starts_with(root));
                prop_assert!(joined != root);
                for c in joined.strip_prefix(root).unwrap().components() {
                    prop_assert!(matches!(c, std::path::Component::Normal(_)), "{:?}", c);
                }
            }
        }

        #[test]
        fn parse_never_panics(input in any::<String>()) {
            let _ = AssetPath::parse(&input);
        }
    }
}
