//! The offline commands, `review` and `mutate`, as functions over bytes so that they are tested
//! without a process; `main.rs` only moves their output to stdout/stderr.

use serde_json::Value;

use crate::policy::basis::VramBasis;
use crate::policy::decide::decide_pod;
use crate::policy::mutation::{Decision, ProjectedFile};
use crate::policy::settings::Settings;
use crate::shell::pod_manifest;
use crate::wire::patch::PatchOp;

/// Why `mutate` could not print the pod or patch it admitted.
#[derive(Debug, thiserror::Error)]
pub enum OfflineCommandError {
    /// The patch could not be encoded as JSON.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// The patch does not apply to the pod it was made for.
    #[error("the patch does not apply: {0}")]
    PatchDoesNotApply(#[from] json_patch::PatchError),
    /// The mutated pod could not be written as YAML.
    #[error("{0}")]
    Yaml(#[from] serde_yaml_ng::Error),
}

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

/// `hami-webhook mutate`: a Pod (YAML or JSON, one document: [`pod_manifest::read`]) in; the
/// mutated pod (or the patch) on stdout, the warnings or the denial on stderr; exit 1 when denied,
/// 2 when the input is not a pod.
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
    let manifest = match pod_manifest::read(input) {
        Ok(m) => m,
        Err(e) => return fail(e.to_string()),
    };
    // The view `review` decodes from `request.object`, decoded by the same code from the JSON the
    // API server would send: offline and online read every pod alike.
    let pod = match manifest.pod(input) {
        Ok(p) => p,
        Err(e) => return fail(e.to_string()),
    };
    // Where the API server would fill in the request's namespace, kubectl's default.
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
            let stdout = match output {
                MutateOutput::Patch => serde_json::to_string_pretty(&patch)
                    .map(|s| s + "\n")
                    .map_err(OfflineCommandError::from),
                MutateOutput::Pod => mutated_pod(manifest.object.clone(), &patch),
            };
            let stdout = match stdout {
                Ok(s) => s,
                Err(e) => return fail(e.to_string()),
            };
            CommandOutput {
                stdout,
                stderr: admitted_stderr(&warnings, &limits_files, patch.is_empty()),
                code: 0,
            }
        }
    }
}

/// The pod with `patch` applied, as YAML.
fn mutated_pod(mut object: Value, patch: &[PatchOp]) -> crate::Result<String, OfflineCommandError> {
    let ops = serde_json::to_value(patch).and_then(serde_json::from_value::<json_patch::Patch>)?;
    json_patch::patch(&mut object, &ops)?;
    Ok(serde_yaml_ng::to_string(&object)?)
}

/// What `mutate` prints on stderr for an admitted pod: the warnings, the limits files the
/// downward-API volume would project (KAI file delivery), and whether nothing changed.
fn admitted_stderr(warnings: &[String], limits_files: &[ProjectedFile], unchanged: bool) -> String {
    let mut stderr: String = warnings.iter().map(|w| format!("warning: {w}\n")).collect();
    for file in limits_files {
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
    if unchanged {
        stderr.push_str("unchanged: the webhook would admit this pod as is\n");
    }
    stderr
}
