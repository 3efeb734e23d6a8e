//! The crate's modules form an acyclic graph: a module never reaches itself through the paths it
//! names (`crate::…`, `super::…`, `mod` declarations). Checked per file (`kai::downward`) and per
//! top-level module (`kai`), on the source text, so that a circle fails the build's tests the day
//! it is introduced. Test modules (`#[cfg(test)] mod tests`) are left out: they may look anywhere.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/kai/downward.rs` → `kai::downward`; `src/kai/mod.rs` → `kai`; `src/lib.rs` → ``.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without comments and without its test module.
fn code(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|l| match l.trim_start().starts_with("//") {
            true => "",
            false => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path a module names: `crate::a::b`, `crate::{a, b::c}`, `super::x`, `mod x;`.
fn named_paths(module: &str, code: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|p| {
                p.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|p| !p.is_empty())
            .collect()
    };
    let here: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // e.g. `hami_crate::`
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                let p = ident(item.trim());
                if !p.is_empty() {
                    out.push(p);
                }
            }
        } else {
            out.push(ident(rest));
        }
    }
    for (i, _) in code.match_indices("super::") {
        if code[..i].ends_with("::") {
            continue;
        }
        let mut base = here.clone();
        base.pop();
        let rest = &code[i + "super::".len()..];
        let mut p = base;
        p.extend(ident(rest));
        out.push(p);
    }
    for line in code.lines() {
        let t = line
            .trim_start()
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ");
        if let Some(name) = t.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            let mut p = here.clone();
            p.push(name.trim().to_owned());
            out.push(p);
        }
    }
    out
}

/// The module a path lands in: its longest prefix that is a module.
fn resolve(modules: &BTreeSet<String>, path: &[String]) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| modules.contains(m))
}

fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_owned(), 1);
        stack.push(n.to_owned());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let start = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, graph, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

fn graphs() -> (
    BTreeMap<String, BTreeSet<String>>,
    BTreeMap<String, BTreeSet<String>>,
) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.retain(|f| !f.ends_with("main.rs"));
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(&src, f))
        .filter(|m| !m.is_empty())
        .collect();
    let mut by_file: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut by_top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let module = module_of(&src, f);
        if module.is_empty() {
            continue; // lib.rs declares and re-exports everything
        }
        let text = std::fs::read_to_string(f).unwrap();
        for path in named_paths(&module, &code(&text)) {
            let Some(target) = resolve(&modules, &path) else {
                continue;
            };
            if target != module {
                by_file
                    .entry(module.clone())
                    .or_default()
                    .insert(target.clone());
            }
            let top = |m: &str| m.split("::").next().unwrap_or("").to_owned();
            if top(&target) != top(&module) {
                by_top.entry(top(&module)).or_default().insert(top(&target));
            }
        }
    }
    (by_file, by_top)
}

#[test]
fn the_module_graph_has_no_circle() {
    let (by_file, by_top) = graphs();
    // The check sees the edges it should (a parser that sees nothing proves nothing).
    assert!(by_file["decide"].contains("kai"), "{by_file:#?}");
    assert!(by_file["kai"].contains("kai::downward"), "{by_file:#?}");
    assert!(
        by_file["kai::downward"].contains("mutation"),
        "{by_file:#?}"
    );
    assert!(by_top["settings"].contains("kai"), "{by_top:#?}");
    if let Some(cycle) = find_cycle(&by_file) {
        panic!("module circle: {}\n{by_file:#?}", cycle.join(" -> "));
    }
    if let Some(cycle) = find_cycle(&by_top) {
        panic!(
            "top-level module circle: {}\n{by_top:#?}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_checker_finds_a_circle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let module = "kai::select";
    let paths = named_paths(
        module,
        "use crate::{delivery, kai::quantity::Fraction};\nuse super::settings::X;\npub mod inner;\n",
    );
    assert!(paths.contains(&vec!["delivery".to_owned()]));
    assert!(paths.contains(&vec!["kai".into(), "quantity".into(), "Fraction".into()]));
    assert!(paths.contains(&vec!["kai".into(), "settings".into(), "X".into()]));
    assert!(paths.contains(&vec!["kai".into(), "select".into(), "inner".into()]));
}
