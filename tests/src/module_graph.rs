//! The import graph of a crate's modules, read from its source text, and the first circle in it.
//!
//! One checker for every crate of the workspace (`tests/tests/it/module_graph.rs`): it resolves every
//! `crate::…`, `super::…` and `self::…` path (in `use` items, braces expanded, and inline; comments
//! and string literals excluded) to the module file it names. A module and its parent count as two
//! modules: a `mod.rs` that uses its child while the child uses an item of the `mod.rs` is a circle
//! too (move the item down into its own module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/a/b.rs` and `src/a/b/mod.rs` → `["a", "b"]`; `src/lib.rs` → `[]`.
pub fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text without `//` comments (doc links are not imports) and string literals.
pub fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = '\0';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                }
            } else if c == '"' {
                in_str = true;
            } else if c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            } else {
                kept.push(c);
            }
            prev = if prev == '\\' && c == '\\' { '\0' } else { c };
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
pub fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_owned()];
    };
    let prefix = &tree[..open];
    let close = tree.rfind('}').unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|i| !i.trim().is_empty())
        .flat_map(|item| {
            expand(item).into_iter().map(move |p| {
                if p == "self" {
                    prefix.trim_end_matches("::").to_owned()
                } else {
                    format!("{prefix}{p}")
                }
            })
        })
        .collect()
}

/// Every path starting with `crate`, `super` or `self` in `code`.
pub fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // `use` items, braces expanded.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let after = &rest[at + 4..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = after.find(';') else { break };
        let tree: String = after[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if ["crate::", "super::", "self::"]
            .iter()
            .any(|p| tree.starts_with(p))
        {
            out.extend(expand(&tree));
        }
    }
    // Inline paths (`crate::a::b::f(...)`).
    let bytes = code.as_bytes();
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(root) {
            let at = from + i;
            from = at + root.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            if code[..at].trim_end().ends_with("use") || code[..at].trim_end().ends_with('{') {
                // Already counted as part of a `use` tree (or a nested one).
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(path.trim_end_matches(':').to_owned());
        }
    }
    out
}

/// The module a path names: the longest prefix that is a module of the crate.
pub fn resolve(
    path: &str,
    current: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut segments = path.split("::").filter(|s| !s.is_empty());
    let mut base: Vec<String> = match segments.next()? {
        "crate" => Vec::new(),
        "self" => current.to_vec(),
        "super" => {
            let mut b = current.to_vec();
            b.pop()?;
            b
        }
        _ => return None,
    };
    let mut rest: Vec<&str> = segments.collect();
    while rest.first() == Some(&"super") {
        base.pop()?;
        rest.remove(0);
    }
    let mut best = base.clone();
    for segment in rest {
        base.push(segment.to_owned());
        if modules.contains(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// A module path: `["kai", "downward"]`; `[]` is the crate root.
pub type Module = Vec<String>;
/// Edges from a module to the modules it names.
pub type Edges = BTreeMap<Module, BTreeSet<Module>>;

/// The import graph of the library under `src` (`lib.rs` and every module below it; `main.rs`
/// is left out: a binary's entry point may use anything). Edges into the crate root and a
/// module's edges to itself are dropped: `lib.rs` declares and re-exports everything.
pub fn crate_graph(src: &Path) -> Edges {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.retain(|f| {
        f.file_name().is_some_and(|n| n != "main.rs") && !f.starts_with(src.join("bin"))
    });
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(src, f)).collect();
    let mut edges: Edges = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        let code = code_only(&std::fs::read_to_string(file).unwrap_or_default());
        // Inside the file's inline `mod tests { … }`, `super` is the file's module.
        let split = code.find("#[cfg(test)]\nmod ").unwrap_or(code.len());
        let (body, tests) = code.split_at(split);
        let mut test_scope = module.clone();
        test_scope.push("tests".to_owned());
        for (scope, part) in [(&module, body), (&test_scope, tests)] {
            for path in paths(part) {
                if let Some(target) = resolve(&path, scope, &modules)
                    && target != module
                    && !target.is_empty()
                {
                    edges.entry(module.clone()).or_default().insert(target);
                }
            }
        }
        edges.entry(module).or_default();
    }
    edges
}

/// The graph between top-level modules (`kai::select` → `settings` becomes `kai` → `settings`):
/// a circle here is a circle between the crate's rooms even when every file is acyclic.
pub fn top_level(edges: &Edges) -> Edges {
    let top = |m: &Module| m.iter().take(1).cloned().collect::<Module>();
    let mut out: Edges = BTreeMap::new();
    for (from, to) in edges {
        if from.is_empty() {
            continue;
        }
        let entry = out.entry(top(from)).or_default();
        for t in to {
            if top(t) != top(from) {
                entry.insert(top(t));
            }
        }
    }
    out
}

/// The graph as text, one `module -> targets` line per module (for failure messages).
pub fn render(edges: &Edges) -> String {
    edges
        .iter()
        .map(|(m, to)| {
            format!(
                "{} -> {}",
                name(m),
                to.iter().map(|t| name(t)).collect::<Vec<_>>().join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_owned()
    } else {
        m.join("::")
    }
}

/// The first cycle found by depth-first search, as module names.
pub fn find_cycle(edges: &Edges) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        marks: &mut BTreeMap<Vec<String>, Mark>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let from = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[from..].iter().map(|m| name(m)).collect();
                    cycle.push(name(next));
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(cycle) = visit(next, edges, marks, stack) {
                        return Some(cycle);
                    }
                }
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in edges.keys() {
        if !marks.contains_key(node)
            && let Some(cycle) = visit(node, edges, &mut marks, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}
