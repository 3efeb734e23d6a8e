//! The webhook's certificate: certgen's hooks or cert-manager, and no caBundle in any render.

use super::*;

#[test]
fn certgen_hooks_create_before_and_patch_after() {
    let s = scenario("default");
    let create: &Job = s.get(&format!("{PREFIX}-certgen-create"));
    let patch: &Job = s.get(&format!("{PREFIX}-certgen-patch"));
    let a = annotations(&create.metadata);
    assert_eq!(a["helm.sh/hook"], "pre-install,pre-upgrade,pre-rollback");
    assert_eq!(a["helm.sh/hook-weight"], "-10");
    let b = annotations(&patch.metadata);
    // post-rollback: Helm runs the hooks of the revision rolled back to, so even the first
    // revision's patch Job rewrites the caBundle after a rollback to it.
    assert_eq!(b["helm.sh/hook"], "post-install,post-upgrade,post-rollback");
    let spec = create
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(
        container(spec, "create").args.as_deref().unwrap(),
        [
            "create",
            "--namespace=hami-system",
            "--secret-name=hl-hami-limits-webhook-tls",
            "--service=hl-hami-limits-webhook",
            "--cluster-domain=cluster.local",
            "--ca-days=3650",
            "--cert-days=365",
            "--renew-before-days=30",
        ]
    );
    let pspec = patch.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(
        container(pspec, "patch").args.as_deref().unwrap(),
        [
            "patch",
            "--namespace=hami-system",
            "--secret-name=hl-hami-limits-webhook-tls",
            "--webhook-name=hl-hami-limits"
        ]
    );
    assert_eq!(
        spec.security_context.as_ref().unwrap().run_as_non_root,
        Some(true)
    );
    // The certificate is made for the Service the MutatingWebhookConfiguration calls.
    let svc = s.webhook_config().webhooks.as_ref().unwrap()[0]
        .client_config
        .service
        .clone()
        .unwrap();
    assert!(
        container(spec, "create")
            .args
            .as_ref()
            .unwrap()
            .contains(&format!("--service={}", svc.name))
    );

    // Its RBAC exists before the Jobs run (a hook with a lower weight) and names only its objects.
    let hook_name = format!("{PREFIX}-certgen-hook");
    for m in &s.manifests {
        let v = manifest_value(m);
        if v["metadata"]["name"] == hook_name.as_str() {
            let ann = &v["metadata"]["annotations"];
            assert_eq!(
                ann["helm.sh/hook"],
                "pre-install,pre-upgrade,pre-rollback,post-install,post-upgrade,post-rollback",
                "{}",
                v["kind"]
            );
            assert!(
                ann["helm.sh/hook-weight"]
                    .as_str()
                    .unwrap()
                    .parse::<i32>()
                    .unwrap()
                    < -10
            );
        }
    }
    let role: &Role = s.get(&hook_name);
    assert_eq!(
        rule_set(role.rules.as_deref().unwrap()),
        set(&[
            "/secrets:create[]",
            "/secrets:get[hl-hami-limits-webhook-tls]",
            "/secrets:update[hl-hami-limits-webhook-tls]"
        ])
    );
    let cr: &ClusterRole = s.get(&hook_name);
    assert_eq!(
        rule_set(cr.rules.as_deref().unwrap()),
        set(&[
            "admissionregistration.k8s.io/mutatingwebhookconfigurations:get[hl-hami-limits]",
            "admissionregistration.k8s.io/mutatingwebhookconfigurations:update[hl-hami-limits]",
        ])
    );

    // Renewal CronJob: create then patch, with its own (non-hook) identity and the same rights.
    let cron: &CronJob = s.get(&format!("{PREFIX}-certgen-renew"));
    let cspec = cron.spec.as_ref().unwrap();
    assert_eq!(cspec.concurrency_policy.as_deref(), Some("Forbid"));
    let pod = cspec
        .job_template
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(
        pod.init_containers.as_ref().unwrap()[0]
            .args
            .as_ref()
            .unwrap()[0],
        "create"
    );
    assert_eq!(pod.containers[0].args.as_ref().unwrap()[0], "patch");
    let renew = format!("{PREFIX}-certgen-renew");
    assert!(annotations(s.get::<ServiceAccount>(&renew).meta()).is_empty());
    assert_eq!(
        rule_set(s.get::<Role>(&renew).rules.as_deref().unwrap()),
        rule_set(role.rules.as_deref().unwrap())
    );
}

#[test]
fn cert_manager_replaces_certgen() {
    let s = scenario("cert-manager");
    assert!(
        s.all::<Job>().is_empty() && s.all::<CronJob>().is_empty(),
        "no certgen with cert-manager"
    );
    assert!(
        s.all::<Role>().is_empty(),
        "no certgen RBAC with cert-manager"
    );
    let svc = format!("{PREFIX}-webhook");
    let cert: &cert_manager::Certificate = s.get(&svc);
    assert_eq!(cert.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(cert.spec.secret_name, "hl-hami-limits-webhook-tls");
    assert_eq!(
        cert.spec.dns_names,
        [
            svc.clone(),
            format!("{svc}.{NS}"),
            format!("{svc}.{NS}.svc"),
            format!("{svc}.{NS}.svc.cluster.local")
        ]
    );
    assert!(cert.spec.usages.contains(&"server auth".to_owned()));
    let issuer: &cert_manager::Issuer = s.get(&cert.spec.issuer_ref.name);
    assert!(issuer.spec.self_signed.is_empty());
    assert_eq!(cert.spec.issuer_ref.kind, "Issuer");
    let mwc = s.webhook_config();
    assert_eq!(
        annotations(&mwc.metadata)["cert-manager.io/inject-ca-from"],
        format!("{NS}/{}", cert.name())
    );
    let d: &Deployment = s.get(&svc);
    let tls = pod_spec_of_deployment(d)
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "tls")
        .unwrap();
    assert_eq!(
        tls.secret.as_ref().unwrap().secret_name.as_deref(),
        Some(cert.spec.secret_name.as_str())
    );

    let s = scenario("cert-manager-issuer");
    assert!(
        s.all::<cert_manager::Issuer>().is_empty(),
        "an existing issuer is used as is"
    );
    let cert: &cert_manager::Certificate = s.get(&svc);
    assert_eq!(cert.spec.issuer_ref.name, "corp-ca");
    assert_eq!(cert.spec.issuer_ref.kind, "ClusterIssuer");
    assert_eq!(cert.spec.secret_name, "custom-tls");
}

/// No scenario renders a caBundle (empty or not): the certgen patch Job (post-install,
/// post-upgrade, post-rollback), the renewal CronJob or cert-manager's cainjector is its only
/// writer, so no revision's manifest holds it and a rollback to the first revision (whose install
/// could not know the CA) leaves the live caBundle alone.
#[test]
fn no_scenario_renders_a_ca_bundle() {
    let mut checked = 0;
    for s in rendered().scenarios.values() {
        for mwc in s.all::<MutatingWebhookConfiguration>() {
            for w in mwc.webhooks.iter().flatten() {
                assert!(
                    w.client_config.ca_bundle.is_none(),
                    "{}: {} renders a caBundle",
                    s.name,
                    mwc.name()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "only {checked} webhook configurations");
}
