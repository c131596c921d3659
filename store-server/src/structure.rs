//! Checks of the crate's own structure, run as unit tests: the import graph of `src/` has no
//! circles, and no handler file imports another (handlers share code through `store`,
//! `routes/extract.rs` and `routes/query.rs`). `docs/architecture.md` draws this graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files of `routes/` that hold handlers.
const HANDLERS: &[&str] =
    &["routes/blobs", "routes/read", "routes/refs", "routes/search", "routes/streams", "routes/ops"];

/// Every module file under `src`, by its path without `.rs` (`routes/mod` for `routes/mod.rs`).
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).expect("under src").with_extension("");
                out.insert(rel.to_string_lossy().into_owned(), path);
            }
        }
    }
    out
}

/// The module file a path names: `dir/name` when that file exists, else `dir/mod` or `dir`.
fn resolve(mods: &BTreeMap<String, PathBuf>, dir: &str, name: &str) -> Option<String> {
    let join = |a: &str, b: &str| if a.is_empty() { b.to_owned() } else { format!("{a}/{b}") };
    [join(dir, name), join(&join(dir, name), "mod"), join(dir, "mod")].into_iter().find(|m| mods.contains_key(m))
}

/// Paths of the form `crate::a::b`, `crate::{a, b::c}` and `super::a` in `code`, as the
/// module files they name, seen from module file `me`.
fn imports(mods: &BTreeMap<String, PathBuf>, me: &str, code: &str) -> BTreeSet<String> {
    let dir = me.rsplit_once('/').map_or("", |(d, _)| d);
    let parent_of_mod = if me.ends_with("/mod") { dir.rsplit_once('/').map_or("", |(d, _)| d) } else { dir };
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).map(str::to_owned).collect()
    };
    let mut out = BTreeSet::new();
    let mut add = |base: &str, path: &str| {
        let mut segs = path.split("::").filter(|s| !s.is_empty());
        let Some(first) = segs.next() else { return };
        let second = segs.next();
        let target = match second {
            Some(s) if mods.contains_key(&format!("{}/{first}/{s}", base).trim_start_matches('/').to_owned()) => {
                Some(format!("{base}/{first}/{s}").trim_start_matches('/').to_owned())
            }
            _ => resolve(mods, base, first),
        };
        if let Some(t) = target.filter(|t| t != me && t != "lib" && t != "main") {
            out.insert(t);
        }
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                add("", item.trim());
            }
        } else if let Some(w) = words(rest).first() {
            add("", w);
        }
    }
    for (i, _) in code.match_indices("super::") {
        if code[..i].ends_with("::") {
            continue;
        }
        let base = if me.ends_with("/mod") { parent_of_mod } else { dir };
        let rest = &code[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                add(base, item.trim());
            }
        } else if let Some(w) = words(rest).first() {
            add(base, w);
        }
    }
    // A `mod.rs` names its children without a prefix (`blobs::put_blob`).
    if me.ends_with("/mod") {
        for child in mods.keys().filter(|m| m.starts_with(&format!("{dir}/")) && !m.ends_with("/mod")) {
            let name = &child[dir.len() + 1..];
            if code.contains(&format!("{name}::")) {
                out.insert(child.clone());
            }
        }
    }
    out
}

/// Module file → the module files it imports, test modules left out.
pub(crate) fn graph() -> BTreeMap<String, BTreeSet<String>> {
    graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The same, of any crate's `src`.
fn graph_of(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let mut edges = BTreeMap::new();
    for (name, path) in &mods {
        let text = std::fs::read_to_string(path).expect("readable");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        edges.insert(name.clone(), imports(&mods, name, &code));
    }
    edges
}

/// A circle of the graph, if there is one.
fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            return Some(path[at..].to_vec());
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_import_graph_has_no_circles() {
        let edges = graph();
        for (from, to) in &edges {
            println!("{from} -> {}", to.iter().cloned().collect::<Vec<_>>().join(", "));
        }
        assert!(edges["routes/read"].contains("store"), "the parser sees imports: {:?}", edges["routes/read"]);
        assert_eq!(find_circle(&edges), None);
    }

    #[test]
    fn no_handler_file_imports_another() {
        let edges = graph();
        for h in HANDLERS {
            let bad: Vec<&String> =
                edges[*h].iter().filter(|t| HANDLERS.contains(&t.as_str()) || *t == "routes/mod").collect();
            assert!(bad.is_empty(), "{h} imports {bad:?}");
        }
    }

    /// The SDK too: the CLI and the MCP tools (and the Python package) stand on the same library
    /// surface (`conn`, `reader`, `store`, …), and neither imports the other's internals.
    #[test]
    fn the_clients_import_graph_has_no_circles() {
        let edges = graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../client/src"));
        assert!(edges["mcp"].contains("conn") && edges["cli"].contains("conn"), "{:?}", edges["mcp"]);
        assert!(!edges["mcp"].contains("cli"), "mcp imports the CLI: {:?}", edges["mcp"]);
        assert_eq!(find_circle(&edges), None);
    }

    #[test]
    fn a_circle_is_found() {
        let mut edges = BTreeMap::new();
        edges.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
        edges.insert("b".to_owned(), BTreeSet::from(["c".to_owned()]));
        edges.insert("c".to_owned(), BTreeSet::from(["a".to_owned()]));
        assert_eq!(find_circle(&edges), Some(vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]));
    }
}
