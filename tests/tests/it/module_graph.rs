//! No import circles in any crate of the workspace, between files or between top-level modules:
//! a type and the functions that use it live below their callers. One checker
//! ([`hami_tests::module_graph`]) for every crate, so that a circle fails the tests the day it is
//! introduced.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hami_tests::module_graph::{Edges, crate_graph, expand, find_cycle, paths, render, top_level};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn module(path: &str) -> Vec<String> {
    path.split("::").map(str::to_owned).collect()
}

fn assert_acyclic(krate: &str, edges: &Edges) {
    if let Some(cycle) = find_cycle(edges) {
        panic!(
            "{krate}: import circle between files: {}\n\n{}",
            cycle.join(" -> "),
            render(edges)
        );
    }
    let top = top_level(edges);
    if let Some(cycle) = find_cycle(&top) {
        panic!(
            "{krate}: import circle between top-level modules: {}\n\n{}",
            cycle.join(" -> "),
            render(&top)
        );
    }
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut checked = 0;
    for krate in [
        "shared",
        "config",
        "publish",
        "preload-reference",
        "ops",
        "webhook",
        "device-plugin",
        "certgen",
        "preload",
        "limits",
        "tests",
    ] {
        let src = workspace().join(krate).join("src");
        assert!(src.is_dir(), "{} is missing", src.display());
        if !src.join("lib.rs").is_file() {
            continue; // a binary only (limits): one file, nothing to circle
        }
        assert_acyclic(krate, &crate_graph(&src));
        checked += 1;
    }
    assert!(checked >= 7, "only {checked} crates checked");
}

/// The checker sees the edges it should: a parser that sees nothing proves nothing.
#[test]
fn the_graphs_have_the_edges_the_code_has() {
    let webhook = crate_graph(&workspace().join("webhook/src"));
    assert!(
        webhook[&module("policy::decide")].contains(&module("policy::kai")),
        "{}",
        render(&webhook)
    );
    assert!(
        webhook[&module("policy::kai::select")].contains(&module("policy::kai::quantity")),
        "{}",
        render(&webhook)
    );
    assert!(top_level(&webhook)[&module("policy")].contains(&module("wire")));
    let plugin = crate_graph(&workspace().join("device-plugin/src"));
    assert!(plugin.len() > 10, "{}", render(&plugin));
    assert!(
        plugin
            .values()
            .flatten()
            .any(|m| m.first().is_some_and(|t| t == "allocation")),
        "{}",
        render(&plugin)
    );
}

/// The webhook's folders are its layers: `wire` (the Kubernetes wire types) below `policy` (the
/// pure decisions) below `shell` (process, files, environment, sockets, cluster). A module imports
/// only from its own layer or those below, and the two lower layers name no I/O at all.
#[test]
fn the_webhook_core_reaches_no_shell_and_no_io() {
    let src = workspace().join("webhook/src");
    let webhook = crate_graph(&src);
    let layer = |m: &[String]| m.first().map(String::as_str).unwrap_or("").to_owned();
    let below: BTreeMap<&str, &[&str]> =
        BTreeMap::from([("wire", &["wire"][..]), ("policy", &["policy", "wire"][..])]);
    let mut checked = 0;
    for (from, to) in &webhook {
        let Some(allowed) = below.get(layer(from).as_str()) else {
            continue;
        };
        checked += 1;
        for target in to {
            assert!(
                allowed.contains(&layer(target).as_str()),
                "webhook: {} imports {}: the core ({}) may import only {allowed:?}\n\n{}",
                from.join("::"),
                target.join("::"),
                layer(from),
                render(&webhook)
            );
        }
    }
    assert!(checked >= 15, "only {checked} core modules seen");
    // No I/O named in the core: files, environment, processes, sockets, the async runtime, the
    // cluster client.
    let mut files = Vec::new();
    for folder in ["policy", "wire"] {
        hami_tests::module_graph::rust_files(&src.join(folder), &mut files);
    }
    for file in &files {
        let code = hami_tests::module_graph::code_only(&std::fs::read_to_string(file).unwrap());
        let code = code.split("#[cfg(test)]").next().unwrap_or("");
        for io in [
            "std::fs",
            "std::env",
            "std::process",
            "std::net::Tcp",
            "std::io::std",
            "tokio",
            "kube::",
            "println!",
            "eprintln!",
        ] {
            assert!(
                !code.contains(io),
                "{} names {io}: the webhook's core does no I/O (move it to webhook/src/shell)",
                file.display()
            );
        }
    }
}

/// The device plugin's allocation is split as the webhook's layers are: `allocation/plan` (the
/// pure decision: plan, device list, codec, spec checks, entry check, the pod's annotations)
/// below `allocation/shell` (the allocator, pod lookup, hook folder, host checks, collector). The
/// plan imports only itself, the GPU types and kubelet's messages, and names no I/O.
#[test]
fn the_device_plugin_plan_reaches_no_shell_and_no_io() {
    let src = workspace().join("device-plugin/src");
    let plugin = crate_graph(&src);
    let is_plan = |m: &[String]| m.len() >= 2 && m[0] == "allocation" && m[1] == "plan";
    // The GPU types the plan reads (a GPU, the device table), not their sources; and kubelet's
    // wire messages its answer is written in, as the webhook's policy writes `wire`.
    let allowed = |m: &[String]| {
        is_plan(m)
            || matches!(
                (m.first().map(String::as_str), m.get(1).map(String::as_str)),
                (Some("gpu"), Some("inventory" | "devices")) | (Some("kubelet"), Some("api"))
            )
    };
    let mut checked = 0;
    for (from, to) in &plugin {
        if !is_plan(from) {
            continue;
        }
        checked += 1;
        for target in to {
            assert!(
                allowed(target),
                "device-plugin: {} imports {}: allocation::plan may import only itself and the GPU types (move I/O to allocation::shell)\n\n{}",
                from.join("::"),
                target.join("::"),
                render(&plugin)
            );
        }
    }
    assert!(checked >= 8, "only {checked} plan modules seen");
    // The shell is where the plan's callers live: it is not empty, and it imports the plan.
    assert!(
        plugin
            .iter()
            .any(|(from, to)| from.get(1).is_some_and(|m| m == "shell")
                && to.iter().any(|t| is_plan(t))),
        "{}",
        render(&plugin)
    );
    // Flags are parsed in `cli` alone: the code below it takes plain structs.
    for (from, to) in &plugin {
        if matches!(
            from.first().map(String::as_str),
            Some("allocation" | "commands" | "gpu" | "kubelet" | "regions" | "settings")
        ) {
            assert!(
                !to.iter().any(|t| t.first().is_some_and(|m| m == "cli")),
                "device-plugin: {} imports the command line; take a plain struct instead",
                from.join("::")
            );
        }
    }
    let mut files = Vec::new();
    hami_tests::module_graph::rust_files(&src.join("allocation/plan"), &mut files);
    assert!(files.len() >= 8, "{files:?}");
    for file in &files {
        let code = hami_tests::module_graph::code_only(&std::fs::read_to_string(file).unwrap());
        let code = code.split("#[cfg(test)]").next().unwrap_or("");
        for io in [
            "std::fs",
            "std::env",
            "std::process",
            "std::net",
            "std::io::std",
            "std::os",
            "tokio",
            "tonic",
            "kube::",
            "clap",
            "println!",
            "eprintln!",
        ] {
            assert!(
                !code.contains(io),
                "{} names {io}: the device plugin's plan does no I/O (move it to device-plugin/src/allocation/shell)",
                file.display()
            );
        }
    }
}

/// The contract (`hami-shared`) and the configuration engine (`hami-config`) are types and pure
/// functions: the one file that touches the file system is the contract's bounded, link-refusing
/// read of the region and limits files a tenant writes (`shared/src/region/io.rs`). Writing is
/// `hami-publish`'s; reading configuration files and the environment is the programs'.
#[test]
fn the_contract_and_the_config_engine_do_no_io() {
    const ALLOWED: &str = "shared/src/region/io.rs";
    let mut files = Vec::new();
    for krate in ["shared", "config"] {
        hami_tests::module_graph::rust_files(&workspace().join(krate).join("src"), &mut files);
    }
    let mut checked = 0;
    let mut allowed_seen = false;
    for file in &files {
        let relative = file.strip_prefix(workspace()).unwrap();
        // Unit-test modules (`tests.rs`) and test code after `#[cfg(test)]` may use temp folders.
        if relative.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let code = hami_tests::module_graph::code_only(&std::fs::read_to_string(file).unwrap());
        let code = code.split("#[cfg(test)]").next().unwrap_or("");
        let named = [
            "std::fs",
            "fs::",
            "File::open",
            "File::create",
            "OpenOptions",
            "std::env",
            "std::process",
            "std::net",
            "tokio",
            "println!",
            "eprintln!",
        ]
        .into_iter()
        .filter(|io| code.contains(io))
        .collect::<Vec<_>>();
        if relative == Path::new(ALLOWED) {
            allowed_seen = !named.is_empty();
            continue;
        }
        checked += 1;
        assert!(
            named.is_empty(),
            "{} names {named:?}: the contract and the configuration engine do no I/O (writes go to \
             hami-publish, reads of settings to the programs)",
            relative.display()
        );
    }
    assert!(checked >= 20, "only {checked} files checked");
    // The checker sees I/O where there is some.
    assert!(allowed_seen, "{ALLOWED}: no I/O seen by the checker");
}

#[test]
fn the_checker_parses_use_trees_and_finds_circles() {
    assert_eq!(
        expand("crate::a::{b::{C, d}, self, e as f}"),
        [
            "crate::a::b::C",
            "crate::a::b::d",
            "crate::a",
            "crate::a::e"
        ]
    );
    let found = paths("use super::codec::X;\nfn f() { crate::pod::find(); }\n");
    assert!(found.contains(&"super::codec::X".to_owned()), "{found:?}");
    assert!(found.contains(&"crate::pod::find".to_owned()), "{found:?}");

    let mut edges: Edges = BTreeMap::new();
    let (a, b, c) = (module("a"), module("b"), module("c::d"));
    edges.insert(a.clone(), BTreeSet::from([b.clone()]));
    edges.insert(b.clone(), BTreeSet::from([c.clone()]));
    assert_eq!(find_cycle(&edges), None);
    // `c::d` → `a` closes a circle between the top-level modules a, b, c.
    edges.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(find_cycle(&edges).unwrap(), ["a", "b", "c::d", "a"]);
    // Files acyclic, rooms not: `b::x` → `c` and `c` → `b::y`.
    let mut rooms: Edges = BTreeMap::new();
    rooms.insert(module("b::x"), BTreeSet::from([module("c")]));
    rooms.insert(module("c"), BTreeSet::from([module("b::y")]));
    rooms.insert(module("b::y"), BTreeSet::new());
    assert_eq!(find_cycle(&rooms), None);
    assert_eq!(find_cycle(&top_level(&rooms)).unwrap(), ["b", "c", "b"]);

    // A real crate written to disk: the circle is found and named.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct B;\npub fn f(_: crate::a::A) {}\n",
    )
    .unwrap();
    let graph = crate_graph(src);
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "a"]);
}
