//! The configuration reference (`docs/configuration.md`) cannot drift from the code. Each test
//! reads one kind of setting from the code and the matching tables of the reference, and fails
//! both ways — a key the code has and the reference does not list, and a key the reference lists
//! and the code no longer has — naming the key and where it is defined:
//!
//! - the webhook's settings keys: the `Settings` defaults serialized (serde's own renames), every
//!   object flattened to `section.key`; and each environment name in the tables is the one the
//!   layered loader derives from its key (`HAMI_<SECTION>__<KEY>`) or a name the code declares;
//! - the flags and environment variables of `hami-webhook` and `hami-device-plugin`: clap's
//!   `Command` of each binary's `Cli`, walked through every sub-command (`env = "..."`, flattened
//!   argument groups and constants included), each variable on the row of its flag;
//! - the device config (`nvidia:`) and node config (`nodeconfig[]`) keys: `NvidiaConfig` and
//!   `NodeConfigEntry` serialized, plus every `rename = "…"` / `alias = "…"` of
//!   `config/src/device.rs` and `config/src/node.rs` read as text (aliases do not
//!   serialize);
//! - the inventory file's keys: the fields of `FileGpu` in `device-plugin/src/gpu/inventory/file.rs`
//!   (private, so read as text, camelCased as its serde attribute says) against the example;
//! - the chart values: every leaf of `charts/hami-limits/values.yaml` (maps of data such as
//!   `nodeSelector` are one value, as `charts/tests/render.py` counts them) against the values
//!   table.

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory;
use hami_shared::names::{Program, RenamedEnv, deprecated_env};
use hami_tests::docs::{code_blocks, code_spans, headings, rendered_text, section, table_rows};
use hami_tests::real::repo;

const DOC: &str = "docs/configuration.md";

fn doc() -> String {
    std::fs::read_to_string(repo().join(DOC)).unwrap()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The section under the heading whose rendered text is `title`, preceded by as many empty lines
/// as the document has before it (so that line numbers read from it are the document's); a
/// missing heading fails.
fn sec(doc: &str, title: &str) -> String {
    let text = section(doc, title).unwrap_or_else(|| panic!("{DOC} has no heading \"{title}\""));
    let line = headings(doc)
        .into_iter()
        .find(|h| rendered_text(&h.text) == title)
        .map_or(1, |h| h.line);
    format!("{}{text}", "\n".repeat(line - 1))
}

/// A documented key and the line of the reference that lists it.
type Listed = BTreeMap<String, usize>;

/// The code spans of the first column of every table row of `text`, with their lines.
fn first_column(text: &str) -> Listed {
    let mut out = Listed::new();
    for row in table_rows(text) {
        for span in code_spans(&row.cells[0]) {
            out.entry(span).or_insert(row.line);
        }
    }
    out
}

/// Fails with every problem at once.
fn report(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Both directions between the keys of the code and the keys of the reference.
fn compare(
    code: &BTreeSet<String>,
    listed: &Listed,
    defined_in: &str,
    listed_in: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    for key in code {
        if !listed.contains_key(key) {
            problems.push(format!(
                "`{key}` (defined in {defined_in}) is not listed in {DOC}, {listed_in}"
            ));
        }
    }
    for (key, line) in listed {
        if !code.contains(key) {
            problems.push(format!(
                "{DOC}, {listed_in} (line {line}) lists `{key}`, which {defined_in} does not define"
            ));
        }
    }
    problems
}

/// `section.key` for every key of a serialized settings value (one level of sections).
fn flattened(value: &serde_json::Value) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for (k, v) in value.as_object().expect("an object") {
        match v.as_object() {
            Some(inner) => keys.extend(inner.keys().map(|k2| format!("{k}.{k2}"))),
            None => {
                keys.insert(k.clone());
            }
        }
    }
    keys
}

fn is_env_name(s: &str) -> bool {
    s.contains('_')
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// The layered loader's matching: levels split at `__`, case, `_` and `-` ignored within one.
fn loader_form(name: &str) -> Vec<String> {
    name.split("__")
        .map(|part| {
            part.chars()
                .filter(|c| !matches!(c, '_' | '-'))
                .collect::<String>()
                .to_ascii_uppercase()
        })
        .collect()
}

/// One argument of a clap command tree.
#[derive(Debug)]
struct Flag {
    /// `--long` or `-s`.
    names: Vec<String>,
    env: Option<String>,
    /// Sub-command path, e.g. `run` (empty: the top level).
    command: String,
}

fn flags(cmd: &clap::Command, path: &str, out: &mut Vec<Flag>) {
    for arg in cmd.get_arguments() {
        if matches!(arg.get_id().as_str(), "help" | "version") || arg.is_positional() {
            continue;
        }
        let mut names: Vec<String> = arg
            .get_long()
            .map(|l| format!("--{l}"))
            .into_iter()
            .collect();
        names.extend(arg.get_short().map(|s| format!("-{s}")));
        out.push(Flag {
            names,
            env: arg.get_env().map(|e| e.to_string_lossy().into_owned()),
            command: path.to_owned(),
        });
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() != "help" {
            let p = if path.is_empty() {
                sub.get_name().to_owned()
            } else {
                format!("{path} {}", sub.get_name())
            };
            flags(sub, &p, out);
        }
    }
}

/// The flag a first-column code span names: `--hook-path DIR` → `--hook-path`.
fn flag_of(span: &str) -> Option<&str> {
    let first = span.split_whitespace().next()?;
    first.starts_with('-').then_some(first)
}

/// Rows of `text` keyed by the flags of their first column.
fn rows_by_flag(text: &str) -> Vec<(BTreeSet<String>, Vec<String>, usize)> {
    table_rows(text)
        .into_iter()
        .map(|row| {
            let names = code_spans(&row.cells[0])
                .iter()
                .filter_map(|s| flag_of(s).map(str::to_owned))
                .collect();
            (names, row.cells, row.line)
        })
        .collect()
}

fn check_command_line(
    program: &str,
    cmd: &clap::Command,
    defined_in: &str,
    tables: &[(&str, String)],
    extra_env: &BTreeSet<String>,
    env_column: Option<usize>,
) -> Vec<String> {
    let mut all = Vec::new();
    flags(cmd, "", &mut all);
    let listed_in = tables
        .iter()
        .map(|(t, _)| format!("\"{t}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let rows: Vec<_> = tables
        .iter()
        .flat_map(|(_, text)| rows_by_flag(text))
        .collect();
    let mut problems = Vec::new();
    let mut code_names = BTreeSet::new();
    for flag in &all {
        let at = if flag.command.is_empty() {
            format!("{program} (global)")
        } else {
            format!("{program} {}", flag.command)
        };
        for name in &flag.names {
            code_names.insert(name.clone());
            if !rows.iter().any(|(names, _, _)| names.contains(name)) {
                problems.push(format!(
                    "flag `{name}` of `{at}` (defined in {defined_in}) is not listed in {DOC}, {listed_in}"
                ));
            }
        }
        if let (Some(env), Some(long)) = (&flag.env, flag.names.first()) {
            let documented = rows.iter().any(|(names, cells, _)| {
                names.contains(long) && cells.iter().any(|c| c.contains(env.as_str()))
            });
            if !documented {
                problems.push(format!(
                    "environment variable `{env}` of `{long}` (`{at}`, defined in {defined_in}) is not on the row of `{long}` in {DOC}, {listed_in}"
                ));
            }
        }
    }
    let mut known_env: BTreeSet<String> = all.iter().filter_map(|f| f.env.clone()).collect();
    known_env.extend(extra_env.iter().cloned());
    for (names, cells, line) in &rows {
        for name in names {
            if !code_names.contains(name) {
                problems.push(format!(
                    "{DOC}, {listed_in} (line {line}) lists `{name}`, which `{program}` (defined in {defined_in}) does not have"
                ));
            }
        }
        if let Some(col) = env_column {
            for span in cells.get(col).map(|c| code_spans(c)).unwrap_or_default() {
                if is_env_name(&span) && !known_env.contains(&span) {
                    problems.push(format!(
                        "{DOC}, {listed_in} (line {line}) names the variable `{span}`, which `{program}` does not read (no `env = ` in {defined_in}, nor a known constant)"
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn webhook_settings_keys_and_their_environment_names() {
    let doc = doc();
    // `deviceConfigFile` is serialized only when set.
    let settings = hami_webhook::Settings {
        device_config_file: Some("/etc/hami/device-config.yaml".into()),
        ..Default::default()
    };
    let code = flattened(&serde_json::to_value(&settings).unwrap());
    let main = sec(&doc, "hami-webhook settings file, environment and flags");
    let kai = sec(&doc, "The kai: section");
    let tenancy = sec(&doc, "The tenancy: section");
    let mut listed = first_column(&main);
    listed.extend(first_column(&kai));
    listed.extend(first_column(&tenancy));
    let mut problems = compare(
        &code,
        &listed,
        "webhook/src/policy/settings.rs (`Settings`; `kai.*`: webhook/src/policy/kai/settings.rs `KaiSettings`; `tenancy.*`: webhook/src/policy/tenancy/settings.rs `TenancySettings`)",
        "\"hami-webhook settings file, environment and flags\" / \"The kai: section\" / \"The tenancy: section\"",
    );

    // Every environment name on a key's row: the loader's name for that key, or one the code
    // declares (HAMI_LOG_FORMAT, the deprecated names, clap's `env`).
    let mut clap_flags = Vec::new();
    flags(
        &hami_webhook::shell::app::Cli::command(),
        "",
        &mut clap_flags,
    );
    let mut declared: BTreeSet<String> = clap_flags.iter().filter_map(|f| f.env.clone()).collect();
    declared.insert(hami_ops::ENV_LOG_FORMAT.to_owned());
    for renamed in deprecated_env(Program::Webhook) {
        declared.insert(renamed.old.to_owned());
        declared.insert(renamed.new.to_owned());
    }
    let longs: BTreeSet<String> = clap_flags.iter().flat_map(|f| f.names.clone()).collect();
    for text in [&main, &kai, &tenancy] {
        for row in table_rows(text) {
            let Some(key) = code_spans(&row.cells[0]).into_iter().next() else {
                continue;
            };
            let derived = loader_form(&format!("HAMI_{}", key.replace('.', "__")));
            for span in row.cells.get(2).map(|c| code_spans(c)).unwrap_or_default() {
                if let Some(flag) = flag_of(&span) {
                    if !longs.contains(flag) {
                        problems.push(format!(
                            "{DOC} (line {}): `{key}` names the flag `{flag}`, which hami-webhook does not have",
                            row.line
                        ));
                    }
                } else if is_env_name(&span)
                    && loader_form(&span) != derived
                    && !declared.contains(&span)
                {
                    problems.push(format!(
                        "{DOC} (line {}): `{span}` is not the environment name of `{key}` (the loader reads HAMI_{}; webhook/src/shell/settings_load.rs)",
                        row.line,
                        key.replace('.', "__").to_ascii_uppercase()
                    ));
                }
            }
        }
    }
    report("webhook settings", &problems);
}

#[test]
fn webhook_flags_and_environment() {
    let doc = doc();
    let problems = check_command_line(
        "hami-webhook",
        &hami_webhook::shell::app::Cli::command(),
        "webhook/src/shell/app.rs and the argument groups it flattens (webhook/src/shell/vram/source.rs `VramArgs`)",
        &[(
            "hami-webhook command line",
            sec(&doc, "hami-webhook command line"),
        )],
        &BTreeSet::new(),
        None,
    );
    report("hami-webhook command line", &problems);
}

#[test]
fn device_plugin_flags_and_environment() {
    let doc = doc();
    let titles = [
        "Flags and environment",
        "Allocation flags (run)",
        "Flags of plan, install-hook, serve-preload, inventory and regions",
    ];
    let tables: Vec<(&str, String)> = titles.iter().map(|t| (*t, sec(&doc, t))).collect();
    let mut extra = BTreeSet::from([
        hami_device_plugin::gpu::health::ENV_DISABLE_HEALTHCHECKS.to_owned(),
        "RUST_LOG".to_owned(),
    ]);
    let mut problems = Vec::new();
    for &RenamedEnv { old, new, .. } in deprecated_env(Program::DevicePlugin) {
        extra.insert(old.to_owned());
        // The deprecated name is on every row of the new one.
        for (title, text) in &tables {
            for row in table_rows(text) {
                let env = row.cells.get(1).cloned().unwrap_or_default();
                if code_spans(&env).iter().any(|s| s == new)
                    && !code_spans(&env).iter().any(|s| s == old)
                {
                    problems.push(format!(
                        "{DOC}, \"{title}\" (line {}): `{new}` without its deprecated name `{old}` (shared/src/names.rs `DEPRECATED_ENV`)",
                        row.line
                    ));
                }
            }
        }
    }
    let all = sec(&doc, "hami-device-plugin");
    for name in &extra {
        if name != "RUST_LOG" && !all.contains(&format!("`{name}`")) {
            problems.push(format!(
                "`{name}` (read by hami-device-plugin: device-plugin/src/gpu/nvml.rs, cli/) is not in {DOC}, \"hami-device-plugin\""
            ));
        }
    }
    problems.extend(check_command_line(
        "hami-device-plugin",
        &hami_device_plugin::cli::Cli::command(),
        "device-plugin/src/cli/ (mod.rs, and flags.rs: `PlanFlags`, `InstallHookFlags`, `ServePreloadFlags`, `RegionsFlags`, `DeviceListFlags`, `GuardFlags`, `RegionExportFlags`)",
        &tables,
        &extra,
        Some(1),
    ));
    report("hami-device-plugin command line", &problems);
}

/// `rename = "…"` and `alias = "…"` of the serde attributes of `source`, with their lines.
fn serde_names(source: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, line) in source.lines().enumerate() {
        let t = line.trim();
        if !t.starts_with("#[serde(") {
            continue;
        }
        for attr in ["rename = \"", "alias = \""] {
            let mut rest = t;
            while let Some(p) = rest.find(attr) {
                let after = &rest[p + attr.len()..];
                let end = after.find('"').unwrap_or(after.len());
                out.push((after[..end].to_owned(), i + 1));
                rest = &after[end..];
            }
        }
    }
    out
}

#[test]
fn device_config_and_node_config_keys() {
    let doc = doc();
    let device = sec(&doc, "Device config: device-config.yaml");
    let node = sec(&doc, "Node config: config.json");
    let nvidia = serde_json::to_value(hami_config::NvidiaConfig::default()).unwrap();
    let code: BTreeSet<String> = nvidia.as_object().unwrap().keys().cloned().collect();
    let mut problems = compare(
        &code,
        &first_column(&device),
        "config/src/device.rs (`NvidiaConfig`, the `nvidia:` section)",
        "\"Device config: device-config.yaml\"",
    );

    let entry = serde_json::to_value(hami_config::NodeConfigEntry::default()).unwrap();
    let mut node_keys: BTreeSet<String> = entry.as_object().unwrap().keys().cloned().collect();
    let source = read("config/src/node.rs");
    let start = source
        .find("pub struct NodeConfigEntry")
        .expect("NodeConfigEntry");
    let body = &source[start..start + source[start..].find("\n}").unwrap()];
    node_keys.extend(serde_names(body).into_iter().map(|(n, _)| n));
    let node_listed = first_column(&node);
    problems.extend(compare(
        &node_keys,
        &node_listed,
        "config/src/node.rs (`NodeConfigEntry`, serde renames and aliases)",
        "\"Node config: config.json\"",
    ));
    // filterdevices' own keys, on its row.
    let filter = serde_json::to_value(hami_config::FilterDevices::default()).unwrap();
    let row = table_rows(&node)
        .into_iter()
        .find(|r| code_spans(&r.cells[0]).iter().any(|s| s == "filterdevices"));
    for key in filter.as_object().unwrap().keys() {
        if !row
            .as_ref()
            .is_some_and(|r| r.cells.iter().any(|c| c.contains(&format!("\"{key}\""))))
        {
            problems.push(format!(
                "`filterdevices.{key}` (config/src/node.rs `FilterDevices`) is not on the `filterdevices` row of {DOC}, \"Node config: config.json\""
            ));
        }
    }
    // Every serde rename or alias of the two files, whichever struct it is on.
    let both = format!("{device}\n{node}");
    for file in ["config/src/device.rs", "config/src/node.rs"] {
        for (name, line) in serde_names(&read(file)) {
            if !both.contains(&format!("`{name}`")) {
                problems.push(format!(
                    "`{name}` (serde name at {file}:{line}) is not in {DOC}, \"Device config\" / \"Node config\""
                ));
            }
        }
    }
    report("device config and node config", &problems);
}

fn camel(snake: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in snake.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.push(c.to_ascii_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn inventory_file_keys() {
    let doc = doc();
    let text = sec(&doc, "Inventory file (machines without NVIDIA GPUs)");
    let source = read("device-plugin/src/gpu/inventory/file.rs");
    let start = source
        .find("struct FileGpu {")
        .expect("struct FileGpu in inventory.rs");
    let attrs = &source[source[..start].rfind("#[derive").unwrap_or(start)..start];
    assert!(
        attrs.contains("rename_all = \"camelCase\""),
        "FileGpu is no longer camelCase: adapt this test"
    );
    let body = &source[start..start + source[start..].find('}').unwrap()];
    let code: BTreeSet<String> = body
        .lines()
        .filter_map(|l| {
            let t = l.trim().trim_start_matches("pub ");
            let (field, _) = t.split_once(':')?;
            (!t.starts_with("//")
                && !t.starts_with('#')
                && field.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .then(|| camel(field))
        })
        .collect();
    let mut listed = Listed::new();
    for block in code_blocks(&text, "yaml") {
        for line in block {
            let t = line.text.trim_start().trim_start_matches("- ");
            if let Some((key, _)) = t.split_once(':') {
                listed.entry(key.trim().to_owned()).or_insert(line.number);
            }
        }
    }
    let problems = compare(
        &code,
        &listed,
        "device-plugin/src/gpu/inventory/file.rs (`FileGpu`)",
        "\"Inventory file\" (the example)",
    );
    report("inventory file", &problems);
}

/// Maps whose keys are data (labels, quantities), not chart values (as charts/tests/render.py).
const LEAF_MAPS: [&str; 6] = [
    "nodeSelector",
    "requests",
    "limits",
    "issuerRef",
    "affinity",
    "commonLabels",
];

fn value_keys(prefix: &str, node: &serde_yaml_ng::Value, out: &mut BTreeSet<String>) {
    let last = prefix.rsplit('.').next().unwrap_or(prefix);
    match node.as_mapping() {
        Some(map) if !map.is_empty() && !LEAF_MAPS.contains(&last) => {
            for (k, v) in map {
                let k = k.as_str().expect("string keys in values.yaml");
                let key = if prefix.is_empty() {
                    k.to_owned()
                } else {
                    format!("{prefix}.{k}")
                };
                value_keys(&key, v, out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

#[test]
fn chart_values() {
    let doc = doc();
    let (begin, end) = ("<!-- values:begin -->", "<!-- values:end -->");
    let (a, b) = (
        doc.find(begin).expect("values:begin marker"),
        doc.find(end).expect("values:end marker"),
    );
    let table = &format!("{}{}", "\n".repeat(doc[..a].lines().count()), &doc[a..b]);
    let values: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read("charts/hami-limits/values.yaml")).unwrap();
    let mut code = BTreeSet::new();
    value_keys("", &values, &mut code);
    let mut problems = compare(
        &code,
        &first_column(table),
        "charts/hami-limits/values.yaml",
        "\"Chart values\"",
    );
    // Every top-level key is covered (a new top-level map with only data keys included).
    for top in values
        .as_mapping()
        .unwrap()
        .keys()
        .filter_map(|k| k.as_str())
    {
        if !first_column(table)
            .keys()
            .any(|k| k == top || k.starts_with(&format!("{top}.")))
        {
            problems.push(format!(
                "top-level value `{top}` (charts/hami-limits/values.yaml) has no row in {DOC}, \"Chart values\""
            ));
        }
    }
    report("chart values", &problems);
}
