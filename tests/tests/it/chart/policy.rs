//! The ValidatingAdmissionPolicies that hold the update rules, and the webhook's UPDATE entry where
//! no policy can.

use super::*;

/// The two ValidatingAdmissionPolicies (their CEL is evaluated against sample requests by
/// render.py, and by the real API server in real_cluster): who they match, where, and the
/// identities the scheduler-owned annotations belong to, the same list the webhook reads.
#[test]
fn admission_policies_hold_the_update_rules() {
    let plugin = format!("system:serviceaccount:{NS}:{PREFIX}-device-plugin");
    let scheduler = "system:serviceaccount:kube-system:hami-scheduler";
    let s = scenario("default");
    let policies = s.all::<ValidatingAdmissionPolicy>();
    assert_eq!(
        policies.iter().map(|p| p.name()).collect::<Vec<_>>(),
        [
            format!("{PREFIX}-pod-annotations"),
            format!("{PREFIX}-device-plugin-pods"),
            format!("{PREFIX}-device-plugin-node"),
            format!("{PREFIX}-device-plugin-events"),
        ]
    );
    for p in &policies {
        let b: &ValidatingAdmissionPolicyBinding = s.get(p.name());
        let spec = b.spec.as_ref().unwrap();
        assert_eq!(spec.policy_name.as_deref(), Some(p.name()));
        assert_eq!(
            spec.validation_actions.as_deref(),
            Some(&["Deny".to_owned()][..])
        );
        assert!(
            spec.match_resources.is_none(),
            "the policy says what it matches"
        );
        let ps = p.spec.as_ref().unwrap();
        assert_eq!(ps.failure_policy.as_deref(), Some("Fail"));
        assert!(ps.param_kind.is_none());
        for v in ps.validations.iter().flatten() {
            assert_eq!(v.reason.as_deref(), Some("Forbidden"), "{}", v.expression);
            assert!(v.message_expression.is_some(), "{}", v.expression);
        }
    }
    let pods = policies[0].spec.as_ref().unwrap();
    let constraints = pods.match_constraints.as_ref().unwrap();
    let rules = constraints.resource_rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].operations.as_deref().unwrap(),
        ["CREATE", "UPDATE"]
    );
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["pods"]);
    let excluded = constraints
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    assert_eq!(
        excluded.len(),
        1,
        "the webhook's opt-outs are not the policy's"
    );
    assert_eq!(excluded[0].values.as_deref().unwrap(), [NS, "kube-system"]);
    let writers = pods
        .variables
        .iter()
        .flatten()
        .find(|v| v.name == "writers")
        .unwrap();
    let listed: Vec<String> = serde_json::from_str(&writers.expression).unwrap();
    assert_eq!(listed, [scheduler, plugin.as_str()]);
    assert_eq!(
        s.webhook_settings()["tenancy"]["schedulerAnnotationWriters"],
        json!(listed),
        "the webhook (UPDATE fallback, CREATE) reads the same list"
    );

    // One policy per kind of the plugin's writes (each expression type-checked against its kind).
    for (policy, (group, resource, operations)) in policies[1..].iter().zip([
        ("", "pods", &["UPDATE"][..]),
        ("", "nodes", &["UPDATE"][..]),
        ("events.k8s.io", "events", &["CREATE", "UPDATE"][..]),
    ]) {
        let spec = policy.spec.as_ref().unwrap();
        let constraints = spec.match_constraints.as_ref().unwrap();
        assert!(
            constraints.namespace_selector.is_none(),
            "the plugin is narrowed in every namespace, kube-system included"
        );
        let rules = constraints.resource_rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].api_groups.as_deref().unwrap(), [group]);
        assert_eq!(rules[0].resources.as_deref().unwrap(), [resource]);
        assert_eq!(rules[0].operations.as_deref().unwrap(), operations);
        let condition = &spec.match_conditions.as_ref().unwrap()[0];
        assert_eq!(
            condition.expression,
            format!("request.userInfo.username == \"{plugin}\"")
        );
        // Fail closed without the token's node claim.
        let first = &spec.validations.as_ref().unwrap()[0];
        assert_eq!(first.expression, "variables.nodeName != ''");
    }

    // The operator's identities, no device plugin of ours: no node policy, no plugin writer.
    let s = scenario("scheduler-identities");
    let policies = s.all::<ValidatingAdmissionPolicy>();
    assert_eq!(policies.len(), 1);
    assert_eq!(
        s.webhook_settings()["tenancy"]["schedulerAnnotationWriters"],
        json!([
            "system:serviceaccount:hami:hami-scheduler",
            "system:serviceaccount:hami:hami-device-plugin"
        ])
    );
}

/// Without the ValidatingAdmissionPolicy API (Kubernetes before 1.30) or with
/// `admissionPolicy.enabled=false`, the webhook's UPDATE entry enforces the pod rules: its own
/// entry, same service and namespaces, no pod-label opt-out, never reinvoked.
#[test]
fn update_entry_only_where_no_policy_holds_the_update_rules() {
    for name in ["no-vap-api", "admission-policy-off"] {
        let s = scenario(name);
        assert!(s.all::<ValidatingAdmissionPolicy>().is_empty(), "{name}");
        assert!(
            s.all::<ValidatingAdmissionPolicyBinding>().is_empty(),
            "{name}"
        );
        let hooks = s.webhook_config().webhooks.as_ref().unwrap();
        assert_eq!(hooks.len(), 2, "{name}: CREATE and UPDATE");
        update_entry(&hooks[0], &hooks[1]);
    }
}

fn update_entry(
    w: &k8s_openapi::api::admissionregistration::v1::MutatingWebhook,
    u: &k8s_openapi::api::admissionregistration::v1::MutatingWebhook,
) {
    assert_eq!(u.name, "update.hami-limits.hami.io");
    assert_eq!(u.side_effects, "None");
    assert_eq!(u.failure_policy, w.failure_policy);
    assert_eq!(u.timeout_seconds, w.timeout_seconds);
    assert_eq!(u.reinvocation_policy.as_deref(), Some("Never"));
    let rules = u.rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].operations.as_deref().unwrap(), ["UPDATE"]);
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["pods"]);
    assert_eq!(
        u.client_config.service.as_ref().unwrap().path.as_deref(),
        Some("/mutate")
    );
    assert!(u.client_config.ca_bundle.is_none());
    assert_eq!(u.namespace_selector, w.namespace_selector);
    assert!(
        u.object_selector.is_none(),
        "a pod label must not exempt its updates"
    );
    let conditions = u.match_conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 1);
    for needle in [
        "'limits.hami.io/'",
        "'hami.io/limit-delivery'",
        "\"hami.io/bind-time\"",
        "oldObject",
        "\"hami.io/bind-phase\"",
        "'hami.io/vgpu-node'",
        "oldObject.metadata.labels",
    ] {
        assert!(
            conditions[0].expression.contains(needle),
            "UPDATE matchConditions lacks {needle}: {}",
            conditions[0].expression
        );
    }
}

#[test]
fn ignore_policy_without_match_conditions_and_extra_exclusions() {
    let s = scenario("ignore-no-conditions");
    let w = &s.webhook_config().webhooks.as_ref().unwrap()[0];
    assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(w.timeout_seconds, Some(5));
    assert!(w.match_conditions.is_none());
    assert_eq!(s.webhook_config().webhooks.as_ref().unwrap().len(), 1);
    let exprs = w
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    assert_eq!(
        exprs[0].values.as_deref().unwrap(),
        [NS, "kube-system", "monitoring", "kai-resource-reservation"]
    );
    assert!(s.all::<CronJob>().is_empty(), "renewal disabled");
    assert_eq!(s.all::<Job>().len(), 2, "hook Jobs stay");
}
