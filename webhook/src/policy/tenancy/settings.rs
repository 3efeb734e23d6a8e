//! The `tenancy:` settings section: which identities and namespaces the operator trusts with what
//! a tenant's pod spec may not do by default (plain data; the decisions are in
//! [`crate::policy::tenancy`]).

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// HAMi's scheduler ServiceAccount as HAMi's chart installs it in `kube-system`.
pub const HAMI_SCHEDULER_USER: &str = "system:serviceaccount:kube-system:hami-scheduler";

/// The `tenancy:` settings section. Unknown keys are refused (the message names the key). Each
/// list may also be given as one comma-separated string (how an environment variable such as
/// `HAMI_TENANCY__KAIOPTOUTNAMESPACES=ml-a,ml-b` carries it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct TenancySettings {
    /// Usernames (`request.userInfo.username`) that may add, change or remove the HAMi
    /// scheduler's pod annotations (`hami.io/vgpu-node`, `hami.io/vgpu-devices-to-allocate`,
    /// `hami.io/bind-phase`, ...) and its `hami.io/vgpu-node` label on UPDATE: HAMi's scheduler
    /// and the device plugin. Default `[system:serviceaccount:kube-system:hami-scheduler]`.
    #[serde(deserialize_with = "name_list")]
    pub scheduler_annotation_writers: Vec<String>,
    /// Namespaces whose GPU containers may set HAMi-core's variables themselves
    /// (`CUDA_DEVICE_MEMORY_LIMIT*`, `CUDA_DEVICE_SM_LIMIT*`, `CUDA_DISABLE_CONTROL`, ...,
    /// `envFrom` sources that could carry them, and other values of `CUDA_TASK_PRIORITY` and
    /// `GPU_CORE_UTILIZATION_POLICY`): HAMi's behaviour. Default empty: denied everywhere.
    #[serde(deserialize_with = "name_list")]
    pub allow_hami_core_env_namespaces: Vec<String>,
    /// Namespaces where a pod may not choose `hami.io/limit-delivery: env` (on CREATE or UPDATE).
    /// Default empty: the per-pod choice is honoured everywhere.
    #[serde(deserialize_with = "name_list")]
    pub forbid_env_delivery_namespaces: Vec<String>,
    /// Namespaces where a KAI pod's own opt-out (annotation `kai-resource-isolator.io/inject:
    /// "false"` or label `kai-resource-isolator.io/webhook: ignore`) is honoured. Default empty:
    /// ignored everywhere, with a warning.
    #[serde(deserialize_with = "name_list")]
    pub kai_opt_out_namespaces: Vec<String>,
}

impl Default for TenancySettings {
    fn default() -> Self {
        Self {
            scheduler_annotation_writers: vec![HAMI_SCHEDULER_USER.to_owned()],
            allow_hami_core_env_namespaces: Vec::new(),
            forbid_env_delivery_namespaces: Vec::new(),
            kai_opt_out_namespaces: Vec::new(),
        }
    }
}

/// Whether `namespace` is one of `list` (an unknown namespace is in none).
fn listed(list: &[String], namespace: Option<&str>) -> bool {
    namespace.is_some_and(|ns| list.iter().any(|n| n == ns))
}

impl TenancySettings {
    /// Whether `user` may write the HAMi scheduler's annotations (an unknown user may not).
    #[must_use]
    pub fn may_write_scheduler_annotations(&self, user: Option<&str>) -> bool {
        listed(&self.scheduler_annotation_writers, user)
    }

    /// Whether pods of `namespace` may set HAMi-core's variables.
    #[must_use]
    pub fn allows_hami_core_env(&self, namespace: Option<&str>) -> bool {
        listed(&self.allow_hami_core_env_namespaces, namespace)
    }

    /// Whether `hami.io/limit-delivery: env` is refused in `namespace`.
    #[must_use]
    pub fn forbids_env_delivery(&self, namespace: Option<&str>) -> bool {
        listed(&self.forbid_env_delivery_namespaces, namespace)
    }

    /// Whether a KAI pod's own opt-out is honoured in `namespace`.
    #[must_use]
    pub fn honours_kai_opt_out(&self, namespace: Option<&str>) -> bool {
        listed(&self.kai_opt_out_namespaces, namespace)
    }
}

/// A list of names: a sequence of non-empty strings, or one string of comma-separated names
/// (spaces around each trimmed, empty items skipped).
fn name_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct NameList;
    impl<'de> Visitor<'de> for NameList {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of names, or one string of comma-separated names")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(name) = seq.next_element::<String>()? {
                if name.is_empty() {
                    return Err(de::Error::custom(
                        "an empty name matches nothing; remove it",
                    ));
                }
                out.push(name);
            }
            Ok(out)
        }
    }
    deserializer.deserialize_any(NameList)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_deny_everything_but_hamis_scheduler() {
        let t = TenancySettings::default();
        assert!(t.may_write_scheduler_annotations(Some(HAMI_SCHEDULER_USER)));
        assert!(!t.may_write_scheduler_annotations(Some("alice")));
        assert!(!t.may_write_scheduler_annotations(None));
        assert!(!t.allows_hami_core_env(Some("default")));
        assert!(!t.forbids_env_delivery(Some("default")));
        assert!(!t.honours_kai_opt_out(Some("default")));
    }

    #[test]
    fn lists_from_sequences_or_comma_separated_strings() {
        let t: TenancySettings = serde_yaml_ng::from_str(
            "allowHamiCoreEnvNamespaces: [ml-a, ml-b]\nkaiOptOutNamespaces: ' ml-c, ,ml-d '\nforbidEnvDeliveryNamespaces: null\n",
        )
        .unwrap();
        assert_eq!(t.allow_hami_core_env_namespaces, ["ml-a", "ml-b"]);
        assert_eq!(t.kai_opt_out_namespaces, ["ml-c", "ml-d"]);
        assert!(t.forbid_env_delivery_namespaces.is_empty());
        assert_eq!(t.scheduler_annotation_writers, [HAMI_SCHEDULER_USER]);
        assert!(t.allows_hami_core_env(Some("ml-b")));
        assert!(!t.allows_hami_core_env(None));
        for (yaml, fragment) in [
            ("kaiOptOutNamespaces: [\"\"]\n", "empty name"),
            ("kaiOptOutNamespaces: 3\n", "comma-separated"),
            ("kaiOptOutNamespace: [a]\n", "kaiOptOutNamespace"),
        ] {
            let err = serde_yaml_ng::from_str::<TenancySettings>(yaml)
                .unwrap_err()
                .to_string();
            assert!(err.contains(fragment), "{yaml}: {err}");
        }
    }
}
