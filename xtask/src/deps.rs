//! The dependency picture of ARCHITECTURE.md, checked: which workspace crate
//! may depend (normally, not as a dev-dependency) on which. A crate takes
//! only what its job needs; the native host in particular relays frames and
//! must not link the session SDK.

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Each workspace crate and the workspace crates it may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    ("pedelec-protocol", &[]),
    ("pedelec-ipc", &["pedelec-protocol"]),
    ("pedelec-client", &["pedelec-protocol", "pedelec-ipc"]),
    ("pedelec-sdk", &["pedelec-protocol", "pedelec-client", "pedelec-ipc"]),
    ("pedelec-core", &["pedelec-protocol", "pedelec-tool", "pedelec-ipc"]),
    ("pedelec-tool", &["pedelec-protocol", "pedelec-ipc"]),
    ("pedelec-native-host", &["pedelec-protocol", "pedelec-client"]),
    ("pedelec-test-agents", &[]),
    ("pedelec-web-e2e", &["pedelec-protocol", "pedelec-sdk"]),
    ("xtask", &[]),
];

pub fn check() -> Result<()> {
    let output = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    let packages = metadata["packages"].as_array().context("cargo metadata lists packages")?;
    let ours: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut broken = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default();
        let Some((_, allowed)) = ALLOWED.iter().find(|(crate_name, _)| *crate_name == name) else {
            broken.push(format!("{name} is not in xtask's dependency picture (xtask/src/deps.rs, ARCHITECTURE.md)"));
            continue;
        };
        for dependency in package["dependencies"].as_array().into_iter().flatten() {
            let target = dependency["name"].as_str().unwrap_or_default();
            let normal = dependency["kind"].is_null();
            if normal && ours.contains(&target) && !allowed.contains(&target) {
                broken.push(format!("{name} must not depend on {target}"));
            }
        }
    }
    if !broken.is_empty() {
        bail!("the crate dependency picture is broken:\n  {}", broken.join("\n  "));
    }
    eprintln!("crate dependencies match the picture ({} crates)", packages.len());
    check_module_cycles()
}

/// The crate whose modules must import each other without a cycle: Core,
/// where providers see only the turn they serve and the session sees
/// providers through their interface.
const ACYCLIC_CRATE: &str = "crates/pedelec-core/src";

/// Checks that no file of Core's library imports, directly or through
/// others, a file that imports it back. A file's imports are the `crate::`
/// and `super::` paths it names outside comments and its `#[cfg(test)] mod
/// tests`, each resolved to the file of the longest module prefix that
/// exists. A module declaring or using its own children (`mod.rs` and the
/// files below it) is composition, not an import.
pub fn check_module_cycles() -> Result<()> {
    let root = crate::root().join(ACYCLIC_CRATE);
    let graph = ModuleGraph::read(&root)?;
    let cycles = graph.cycles();
    if !cycles.is_empty() {
        let listed: Vec<String> = cycles.iter().map(|c| c.join(" → ")).collect();
        bail!("Core's modules import each other in a cycle:\n  {}", listed.join("\n  "));
    }
    eprintln!("Core's {} module files import each other without a cycle", graph.files.len());
    Ok(())
}

struct ModuleGraph {
    /// Each file's module path (`["session", "machine"]`) and its path below the crate's `src`.
    files: Vec<(Vec<String>, String)>,
    /// For each file, the files it imports (indices into `files`).
    imports: Vec<std::collections::BTreeSet<usize>>,
}

impl ModuleGraph {
    fn read(root: &std::path::Path) -> Result<Self> {
        let mut paths = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
                let path = entry?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    paths.push(path);
                }
            }
        }
        paths.sort();
        let mut files = Vec::new();
        for path in &paths {
            let relative = path.strip_prefix(root)?.to_string_lossy().replace('\\', "/");
            let mut module: Vec<String> = relative.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
            if module.last().is_some_and(|m| m == "mod") || module == ["lib"] || module == ["main"] {
                module.pop();
            }
            files.push((module, relative));
        }
        let find =
            |path: &[String]| (1..=path.len()).rev().find_map(|n| files.iter().position(|(m, _)| m[..] == path[..n]));
        let mut imports = vec![std::collections::BTreeSet::new(); files.len()];
        for (index, path) in paths.iter().enumerate() {
            let text = std::fs::read_to_string(path)?;
            let own = &files[index].0;
            let children: Vec<&str> = files
                .iter()
                .filter(|(m, _)| m.len() == own.len() + 1 && m.starts_with(own))
                .map(|(m, _)| m[own.len()].as_str())
                .collect();
            for target in referenced_paths(&text, own, &children) {
                // A module using its own children is composition, not an
                // import: only an edge out of the file's own subtree counts.
                if let Some(file) = find(&target).filter(|&f| !files[f].0.starts_with(own)) {
                    imports[index].insert(file);
                }
            }
        }
        Ok(ModuleGraph { files, imports })
    }

    /// The strongly connected groups of more than one file (Tarjan), each
    /// as its files' paths.
    fn cycles(&self) -> Vec<Vec<String>> {
        struct Walk<'a> {
            graph: &'a ModuleGraph,
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            stack: Vec<usize>,
            on_stack: Vec<bool>,
            next: usize,
            found: Vec<Vec<String>>,
        }
        impl Walk<'_> {
            fn visit(&mut self, v: usize) {
                self.index[v] = Some(self.next);
                self.low[v] = self.next;
                self.next += 1;
                self.stack.push(v);
                self.on_stack[v] = true;
                for &w in &self.graph.imports[v] {
                    match self.index[w] {
                        None => {
                            self.visit(w);
                            self.low[v] = self.low[v].min(self.low[w]);
                        }
                        Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                        Some(_) => {}
                    }
                }
                if Some(self.low[v]) == self.index[v] {
                    let mut group = Vec::new();
                    while let Some(w) = self.stack.pop() {
                        self.on_stack[w] = false;
                        group.push(self.graph.files[w].1.clone());
                        if w == v {
                            break;
                        }
                    }
                    if group.len() > 1 {
                        group.sort();
                        self.found.push(group);
                    }
                }
            }
        }
        let n = self.files.len();
        let mut walk = Walk {
            graph: self,
            index: vec![None; n],
            low: vec![0; n],
            stack: Vec::new(),
            on_stack: vec![false; n],
            next: 0,
            found: Vec::new(),
        };
        for v in 0..n {
            if walk.index[v].is_none() {
                walk.visit(v);
            }
        }
        walk.found
    }
}

/// The module paths a file names: `crate::a::b`, `crate::{a, b::c}` (one
/// level of braces inside), and `super::…`, `self::…` or `child::…` (one of
/// `children`, the file's child modules) relative to `module`, the file's
/// own module path. Line comments and a trailing `#[cfg(test)] mod tests`
/// are left out.
fn referenced_paths(text: &str, module: &[String], children: &[&str]) -> Vec<Vec<String>> {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
    let code = match code.find("#[cfg(test)]\nmod tests") {
        Some(at) => &code[..at],
        None => &code[..],
    };
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        // A path's first segment: not inside a word, not after `::`.
        let starts_word = i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == ':');
        let rest: String = bytes[i..bytes.len().min(i + 7)].iter().collect();
        let word: String = bytes[i..].iter().take_while(|&&c| ident(c)).collect();
        let (base, skip) = if starts_word && rest.starts_with("crate::") {
            (Vec::new(), 7)
        } else if starts_word && rest.starts_with("self::") {
            (module.to_vec(), 6)
        } else if starts_word
            && children.contains(&word.as_str())
            && bytes[i + word.len()..].iter().take(2).collect::<String>() == "::"
        {
            (module.to_vec(), 0)
        } else if starts_word && rest.starts_with("super::") {
            let mut depth = 0;
            let mut j = i;
            while bytes[j..].iter().take(7).collect::<String>() == "super::" {
                depth += 1;
                j += 7;
            }
            (module[..module.len().saturating_sub(depth)].to_vec(), j - i)
        } else {
            i += 1;
            continue;
        };
        i += skip;
        // A path: segments separated by `::`, ending at a brace group or elsewhere.
        let mut path = base;
        loop {
            let start = i;
            while i < bytes.len() && ident(bytes[i]) {
                i += 1;
            }
            if i > start {
                path.push(bytes[start..i].iter().collect());
            }
            if bytes[i..].iter().take(2).collect::<String>() == "::" {
                i += 2;
                continue;
            }
            break;
        }
        if i < bytes.len() && bytes[i] == '{' {
            let mut depth = 0;
            let start = i + 1;
            while i < bytes.len() {
                match bytes[i] {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            let group: String = bytes[start..i].iter().collect();
            for item in split_top_level(&group) {
                let head = item.trim().split(['{', ' ']).next().unwrap_or_default();
                let mut full = path.clone();
                full.extend(head.split("::").filter(|s| !s.is_empty() && *s != "self").map(str::to_owned));
                found.push(full);
            }
        } else {
            found.push(path);
        }
    }
    found
}

/// `a, b::{c, d}, e` → `["a", "b::{c, d}", "e"]`.
fn split_top_level(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(path: &str) -> Vec<String> {
        path.split('/').filter(|s| !s.is_empty()).map(str::to_owned).collect()
    }

    #[test]
    fn paths_are_read_from_uses_groups_and_supers() {
        let text = "use crate::session::machine::Effect;\nuse crate::{clock, providers::{A, B}};\n\
                    // crate::ignored::InAComment\nfn f() { super::super::x::y(); supercrate::no(); }\n\
                    #[cfg(test)]\nmod tests { use crate::only_in_tests; }\n";
        let found = referenced_paths(text, &module("providers/acp"), &[]);
        let shown: Vec<String> = found.iter().map(|p| p.join("::")).collect();
        assert_eq!(shown, ["session::machine::Effect", "clock", "providers", "x::y"]);
        let text = "use machine::{Effect, Now};\nfn f() { self::log::open(); other::machine::no(); }\n";
        let found = referenced_paths(text, &module("session"), &["machine", "log"]);
        let shown: Vec<String> = found.iter().map(|p| p.join("::")).collect();
        assert_eq!(shown, ["session::machine::Effect", "session::machine::Now", "session::log::open"]);
    }

    #[test]
    fn a_cycle_between_files_is_found_and_a_chain_is_not() {
        let dir = std::env::temp_dir().join(format!("xtask-cycles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("b")).unwrap();
        std::fs::write(dir.join("lib.rs"), "pub mod a; pub mod b; pub mod c;").unwrap();
        std::fs::write(dir.join("a.rs"), "use crate::b::inner::X;").unwrap();
        std::fs::write(dir.join("b/mod.rs"), "pub mod inner; use inner::X;").unwrap();
        std::fs::write(dir.join("b/inner.rs"), "use crate::c::Y;").unwrap();
        std::fs::write(dir.join("c.rs"), "pub struct Y;").unwrap();
        assert!(ModuleGraph::read(&dir).unwrap().cycles().is_empty());
        std::fs::write(dir.join("c.rs"), "use crate::a::Z;").unwrap();
        assert_eq!(ModuleGraph::read(&dir).unwrap().cycles(), [vec!["a.rs", "b/inner.rs", "c.rs"]]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
