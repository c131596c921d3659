//! Checks of the crate's own structure, run as unit tests: the import graph of `src/` has no
//! circles, no handler file imports another (handlers share code through the services and
//! `http/routes/{extract, query}`), no service takes the whole `AppState` (each takes its
//! handle), and the graph that `docs/architecture.md` prints is the graph of the code, so the
//! document cannot drift.
//!
//! A module is read whole, less its test items (`#[cfg(test)]` and the item after it, to its
//! closing brace or semicolon), and less comments.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files that hold handlers.
const HANDLERS: &[&str] = &[
    "http/routes/blobs",
    "http/routes/read",
    "http/routes/refs",
    "http/routes/search",
    "http/routes/streams",
    "http/routes/ops",
];

/// Every module file under `src`, by its path without `.rs` (`http/mod` for `http/mod.rs`);
/// `tests.rs` files are test modules and left out.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && path.file_stem().is_some_and(|s| s != "tests") {
                let rel = path.strip_prefix(src).expect("under src").with_extension("");
                out.insert(rel.to_string_lossy().into_owned(), path);
            }
        }
    }
    out
}

/// The module file a path of segments names, seen from directory `base`: the deepest of
/// `base/a`, `base/a/b`, … that is a module file (`x.rs` or `x/mod.rs`).
fn resolve(mods: &BTreeMap<String, PathBuf>, base: &str, segs: &[&str]) -> Option<String> {
    let join = |a: &str, b: &str| if a.is_empty() { b.to_owned() } else { format!("{a}/{b}") };
    let mut found = None;
    let mut dir = base.to_owned();
    for seg in segs {
        let at = join(&dir, seg);
        if mods.contains_key(&at) {
            found = Some(at.clone());
        } else if mods.contains_key(&join(&at, "mod")) {
            found = Some(join(&at, "mod"));
        } else {
            break;
        }
        dir = at;
    }
    found
}

/// The directory a module file's `super::` starts from, and its own children's directory.
fn dirs(me: &str) -> (String, String) {
    let parent = |p: &str| p.rsplit_once('/').map_or(String::new(), |(d, _)| d.to_owned());
    if let Some(dir) = me.strip_suffix("/mod") {
        (parent(dir), dir.to_owned())
    } else {
        (parent(me), me.to_owned())
    }
}

/// Items of one path group: `a::b`, `{a, b::c}`, `a::{b, c}` as lists of segments.
fn expand(path: &str) -> Vec<Vec<String>> {
    let path = path.trim();
    if let Some(open) = path.find('{') {
        let prefix: Vec<String> = path[..open].split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
        let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
        let mut out = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, c) in inner.char_indices().chain([(inner.len(), ',')]) {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    for tail in expand(&inner[start..i]) {
                        out.push(prefix.iter().cloned().chain(tail).collect());
                    }
                    start = i + 1;
                }
                _ => {}
            }
        }
        out
    } else {
        vec![path.split("::").map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()]
    }
}

/// The path that starts at byte `at` of `code`: segments and groups, up to what ends it.
fn path_at(code: &str, at: usize) -> &str {
    let bytes = code.as_bytes();
    let (mut i, mut depth) = (at, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'{' => depth += 1,
            b'}' if depth > 0 => depth -= 1,
            b'}' => break,
            c if depth == 0 && !(c.is_ascii_alphanumeric() || c == b'_' || c == b':') => break,
            _ => {}
        }
        i += 1;
        if depth == 0 && bytes.get(i - 1) == Some(&b'}') {
            break;
        }
    }
    &code[at..i]
}

/// The module files `code` (of module file `me`) imports through `crate::`, `super::` and
/// `self::` paths, and a `mod.rs`'s or `x.rs`'s plain paths into its own children.
fn imports(mods: &BTreeMap<String, PathBuf>, me: &str, code: &str) -> BTreeSet<String> {
    let (up, own) = dirs(me);
    let mut out = BTreeSet::new();
    for (prefix, base) in [("crate::", String::new()), ("super::", up), ("self::", own.clone())] {
        for (i, _) in code.match_indices(prefix) {
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            for segs in expand(path_at(code, i + prefix.len())) {
                let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
                if let Some(t) = resolve(mods, &base, &segs) {
                    out.insert(t);
                }
            }
        }
    }
    // A module names its children without a prefix (`routes::router`, `local::LocalDisk`).
    for child in mods.keys().filter(|m| m.starts_with(&format!("{own}/"))) {
        let name = child[own.len() + 1..].split('/').next().unwrap_or_default();
        if code.contains(&format!(" {name}::")) || code.contains(&format!("({name}::")) {
            if let Some(t) = resolve(mods, &own, &[name]) {
                out.insert(t);
            }
        }
    }
    out.retain(|t| t != me && t != "lib" && t != "main" && !t.starts_with("testing/"));
    out
}

/// `text` without comments and without its test items.
fn production_code(text: &str) -> String {
    let code: String = text
        .lines()
        .map(|l| l.split_once("//").filter(|(a, _)| !a.contains('"')).map_or(l, |(a, _)| a))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = skip_item(&rest[at + "#[cfg(test)]".len()..]);
    }
    out.push_str(rest);
    out
}

/// What follows the item at the start of `code`: past its first top-level `;` or its
/// balanced braces, whichever comes first.
fn skip_item(code: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in code.char_indices() {
        match c {
            ';' if depth == 0 => return &code[i + 1..],
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &code[i + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// Module file → the module files it imports, test items left out.
pub(crate) fn graph() -> BTreeMap<String, BTreeSet<String>> {
    graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The same, of any crate's `src`; the test kit is left out (it may reach anything).
fn graph_of(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let mut edges = BTreeMap::new();
    for (name, path) in mods.iter().filter(|(n, _)| !n.starts_with("testing/")) {
        let text = std::fs::read_to_string(path).expect("readable");
        edges.insert(name.clone(), imports(&mods, name, &production_code(&text)));
    }
    edges
}

/// Each module's level: 0 for one that imports nothing, else one more than the highest of
/// what it imports (`None` on a circle).
fn levels(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<BTreeMap<String, usize>> {
    fn level(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeMap<String, Option<usize>>,
    ) -> Option<usize> {
        match seen.get(n) {
            Some(Some(l)) => return Some(*l),
            Some(None) => return None,
            None => {}
        }
        seen.insert(n.to_owned(), None);
        let mut l = 0;
        for next in edges.get(n).into_iter().flatten() {
            l = l.max(level(next, edges, seen)? + 1);
        }
        seen.insert(n.to_owned(), Some(l));
        Some(l)
    }
    let mut seen = BTreeMap::new();
    edges.keys().map(|n| level(n, edges, &mut seen).map(|l| (n.clone(), l))).collect()
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

/// The graph as `docs/architecture.md` prints it: one `module -> imports` line each.
fn printed(edges: &BTreeMap<String, BTreeSet<String>>) -> String {
    edges
        .iter()
        .map(|(from, to)| format!("{from} -> {}", to.iter().cloned().collect::<Vec<_>>().join(", ")))
        .map(|l| l.trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The block of `docs/architecture.md` that follows the line `marker`.
fn documented(marker: &str) -> String {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md"))
        .expect("docs/architecture.md");
    let after = doc.split_once(marker).map(|(_, a)| a).unwrap_or_default();
    let block = after.split_once("```\n").map(|(_, b)| b).unwrap_or_default();
    block
        .split_once("```")
        .map(|(b, _)| b)
        .unwrap_or_default()
        .lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_import_graph_has_no_circles() {
        let edges = graph();
        println!("{}", printed(&edges));
        assert!(
            edges["http/routes/read"].contains("blobs/source"),
            "the parser sees imports: {:?}",
            edges["http/routes/read"]
        );
        assert_eq!(find_circle(&edges), None);
        let levels = levels(&edges).expect("no circle");
        let top = levels.values().max().copied().unwrap_or_default();
        println!("import levels: {}", top + 1);
    }

    #[test]
    fn the_documented_graph_is_the_code_s() {
        let code = printed(&graph());
        let doc = documented("The whole graph as the test prints it");
        if code != doc {
            let (c, d): (BTreeSet<&str>, BTreeSet<&str>) = (code.lines().collect(), doc.lines().collect());
            panic!(
                "docs/architecture.md's graph has drifted; in the code only: {:#?}\nin the document only: {:#?}",
                c.difference(&d).collect::<Vec<_>>(),
                d.difference(&c).collect::<Vec<_>>()
            );
        }
    }

    /// Services take the handle they use (`Blobs`, `Streams`, `Tokens`, …); only the edge and
    /// the bundle itself know `AppState`.
    #[test]
    fn no_service_takes_the_whole_state() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let edge =
            |m: &str| m.starts_with("http/") || m.starts_with("testing/") || ["state", "lib", "main"].contains(&m);
        let takers: Vec<String> = modules(&src)
            .into_iter()
            .filter(|(m, _)| !edge(m))
            .filter(|(_, p)| production_code(&std::fs::read_to_string(p).expect("readable")).contains("AppState"))
            .map(|(m, _)| m)
            .collect();
        assert!(takers.is_empty(), "services that take AppState: {takers:?}");
    }

    #[test]
    fn no_handler_file_imports_another() {
        let edges = graph();
        for h in HANDLERS {
            let bad: Vec<&String> =
                edges[*h].iter().filter(|t| HANDLERS.contains(&t.as_str()) || *t == "http/routes/mod").collect();
            assert!(bad.is_empty(), "{h} imports {bad:?}");
        }
    }

    #[test]
    fn test_items_are_left_out_and_the_rest_is_read_whole() {
        let code = "use crate::a::b;\n#[cfg(test)]\nmod tests { use crate::c; fn f() { let x = {1}; } }\n\
                    pub(crate) struct Later; // crate::d\nimpl Later { fn g() { crate::e::f(); } }\n\
                    #[cfg(test)] use crate::g;\nfn h() { super::{x, y::z}::q(); }";
        let kept = production_code(code);
        assert!(kept.contains("crate::a::b") && kept.contains("crate::e::f") && kept.contains("super::{x"));
        assert!(!kept.contains("crate::c") && !kept.contains("crate::d") && !kept.contains("crate::g"), "{kept}");
        assert_eq!(expand("{x, y::{z, w}}"), vec![vec!["x"], vec!["y", "z"], vec!["y", "w"]]);
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
        assert_eq!(levels(&edges), None);
    }
}
