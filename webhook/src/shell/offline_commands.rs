//! The offline commands, `review` and `mutate`, as functions over bytes so that they are tested
//! without a process; `main.rs` only moves their output to stdout/stderr.

use serde_json::Value;

use crate::policy::basis::VramBasis;
use crate::policy::decide::decide_pod;
use crate::policy::mutation::Decision;
use crate::policy::settings::Settings;
use crate::wire::pod::Pod;

/// What a command prints and how it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

/// `hami-webhook review`: one AdmissionReview JSON in, the response AdmissionReview out. Exit 0
/// whatever the decision; 2 when the input is not JSON.
#[must_use]
pub fn review_command(input: &[u8], settings: &Settings, vram: &dyn VramBasis) -> CommandOutput {
    match crate::review(input, settings, vram) {
        Ok(reviewed) => CommandOutput {
            stdout: String::from_utf8_lossy(&reviewed.body).into_owned() + "\n",
            stderr: String::new(),
            code: 0,
        },
        Err(e) => CommandOutput {
            stdout: String::new(),
            stderr: format!("hami-webhook review: {e}\n"),
            code: 2,
        },
    }
}

/// What `mutate` prints on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MutateOutput {
    /// The mutated pod as YAML.
    Pod,
    /// The JSONPatch as JSON.
    Patch,
}

/// `hami-webhook mutate`: a Pod (YAML or JSON) in; the mutated pod (or the patch) on stdout, the
/// warnings or the denial on stderr; exit 1 when denied, 2 when the input is not a pod.
#[must_use]
pub fn mutate_command(
    input: &[u8],
    output: MutateOutput,
    settings: &Settings,
    vram: &dyn VramBasis,
) -> CommandOutput {
    let fail = |message: String| CommandOutput {
        stdout: String::new(),
        stderr: format!("hami-webhook mutate: {message}\n"),
        code: 2,
    };
    // YAML is a superset of JSON, so one parser reads both.
    let mut object: Value = match serde_yaml_ng::from_slice(input) {
        Ok(v) => v,
        Err(e) => return fail(format!("input is not YAML or JSON: {e}")),
    };
    if object.get("kind").and_then(Value::as_str) != Some("Pod") {
        return fail("input is not a Pod (kind: Pod)".to_owned());
    }
    // `nvidia.com/gpu: 1` is an integer in YAML; kubectl and the API server accept it (the typed
    // pod reads it as "1"; the object the patch applies to gets the string too, as kubectl sends).
    hami_shared::manifest::quantities_as_strings(&mut object);
    // The typed pod straight from the user's text, so that an error names the user's line and
    // column (not a column of an internal JSON form).
    let pod: Pod<'_> = match serde_yaml_ng::from_slice(input) {
        Ok(p) => p,
        Err(e) => return fail(format!("not a valid Pod: {e}")),
    };
    let namespace = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    match decide_pod(&pod, Some(namespace), settings, vram) {
        Decision::Deny { message } | Decision::Invalid { message } => CommandOutput {
            stdout: String::new(),
            stderr: format!("denied: {message}\n"),
            code: 1,
        },
        Decision::Allow {
            patch,
            warnings,
            limits_files,
            ..
        } => {
            let mut stderr: String = warnings.iter().map(|w| format!("warning: {w}\n")).collect();
            let stdout = match output {
                MutateOutput::Patch => match serde_json::to_string_pretty(&patch) {
                    Ok(s) => s + "\n",
                    Err(e) => return fail(e.to_string()),
                },
                MutateOutput::Pod => {
                    let mut mutated = object;
                    let ops = serde_json::to_value(&patch)
                        .and_then(serde_json::from_value::<json_patch::Patch>);
                    match ops {
                        Ok(ops) => {
                            if let Err(e) = json_patch::patch(&mut mutated, &ops) {
                                return fail(format!("the patch does not apply: {e}"));
                            }
                        }
                        Err(e) => return fail(e.to_string()),
                    }
                    match serde_yaml_ng::to_string(&mutated) {
                        Ok(s) => s,
                        Err(e) => return fail(e.to_string()),
                    }
                }
            };
            // KAI file delivery: the limits files the downward-API volume would project.
            for file in &limits_files {
                stderr.push_str(&format!(
                    "limits file for container {:?} (read-only at {}):\n",
                    file.container,
                    hami_shared::names::OVERRIDE_ENV_PATH
                ));
                for line in file.text.lines() {
                    stderr.push_str("  ");
                    stderr.push_str(line);
                    stderr.push('\n');
                }
            }
            if patch.is_empty() {
                stderr.push_str("unchanged: the webhook would admit this pod as is\n");
            }
            CommandOutput {
                stdout,
                stderr,
                code: 0,
            }
        }
    }
}
