//! The `hami.io/preload` device plugin (`serve-preload`) against the fake kubelet: it registers
//! its own resource and socket, advertises its slots, answers `Allocate` with read-only mounts of
//! a hook folder `install-hook` filled, refuses a folder it cannot vouch for (naming the file),
//! and registers again after a kubelet restart.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hami_device_plugin::commands::install_hook::{InstallHookArgs, install_hook};
use hami_device_plugin::commands::serve_preload::{
    ServePreloadArgs, ServePreloadError, lifecycle, preload_plugin,
};
use hami_device_plugin::kubelet::plugin;
use hami_device_plugin::regions::export::{PidView, RegionArgs};
use hami_device_plugin::regions::podresources::v1;
use hami_shared::region::fixture::RegionFixture;
use hami_shared::region::layout::V1_2;
use hami_tests::inventory::ONE_H200;
use hami_tests::kubelet::FakeKubelet;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(10);

/// A hook folder filled by the real `install-hook` (stand-in libraries, one GPU from an
/// inventory file, so `node-gpus` is published).
fn installed_hook(dir: &Path) -> PathBuf {
    let image = dir.join("image");
    std::fs::create_dir(&image).unwrap();
    std::fs::write(image.join("libvgpu.so.v2.10.0"), b"\x7fELF hami-core").unwrap();
    let preload = dir.join("libhami_preload.so");
    std::fs::write(&preload, b"\x7fELF preload").unwrap();
    let inventory = dir.join("gpus.yaml");
    std::fs::write(&inventory, ONE_H200).unwrap();
    let hook = dir.join("hook");
    install_hook(&InstallHookArgs {
        hami_core_dir: image,
        preload,
        hook_path: hook.clone(),
        inventory: Some(inventory),
    })
    .unwrap();
    hook
}

/// `serve-preload` without region folders (the KAI regions test turns them on).
fn args(kubelet_dir: &Path, hook: &Path, slots: u32) -> ServePreloadArgs {
    ServePreloadArgs {
        hook_path: hook.to_path_buf(),
        kubelet_dir: kubelet_dir.to_path_buf(),
        slots,
        regions: false,
        metrics_listen: "off".to_owned(),
        pod_resources_socket: kubelet_dir.join("pod-resources.sock"),
        pod_api: false,
        node_name: None,
        region_export: RegionArgs {
            interval: 0.0,
            scrape_files: 32,
            scrape_budget_ms: 500,
            pids: PidView::None,
        },
    }
}

/// Serve in process until the returned sender is dropped or fired.
fn start(
    args: &ServePreloadArgs,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), hami_device_plugin::kubelet::plugin::LifecycleError>>,
) {
    let plugin = Arc::new(preload_plugin(args).unwrap());
    let mut lifecycle = lifecycle(args);
    lifecycle.watch_interval = Duration::from_millis(50);
    lifecycle.backoff_min = Duration::from_millis(20);
    lifecycle.backoff_max = Duration::from_millis(500);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(plugin::serve(lifecycle, plugin, async {
        let _ = stopped.await;
    }));
    (stop, task)
}

#[tokio::test]
async fn registers_advertises_slots_and_mounts_the_hook_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let hook = installed_hook(dir.path());
    let vgpu = hook.join("vgpu");
    let kubelet_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&kubelet_dir).unwrap();
    let mut kubelet = FakeKubelet::start(&kubelet_dir).await.unwrap();
    let (stop, task) = start(&args(&kubelet_dir, &hook, 16));

    let registration = kubelet.wait_for_registration(1, WAIT).await.unwrap();
    assert_eq!(registration.error, None);
    assert_eq!(registration.request.resource_name, "hami.io/preload");
    assert_eq!(registration.request.endpoint, "hami-preload.sock");
    let options = registration.request.options.unwrap();
    assert!(!options.pre_start_required && !options.get_preferred_allocation_available);
    assert_eq!(registration.options, Some(options));
    let devices = registration.devices().unwrap();
    assert_eq!(devices.len(), 16);
    assert_eq!(devices[0].id, "preload-0");
    assert_eq!(devices[15].id, "preload-15");
    assert!(devices.iter().all(|d| d.health == "Healthy"));

    let mut client = kubelet.plugin().await.unwrap();
    let response = client
        .allocate(&[vec!["preload-3".to_owned()], vec!["preload-7".to_owned()]])
        .await
        .unwrap();
    assert_eq!(response.container_responses.len(), 2);
    let v = |name: &str| vgpu.join(name).display().to_string();
    let expected = vec![
        (v("libhami_preload.so"), v("libhami_preload.so")),
        (v("libvgpu.so"), v("libvgpu.so")),
        (v("node-gpus"), v("node-gpus")),
        ("/etc/ld.so.preload".to_owned(), v("ld.so.preload")),
    ];
    for c in &response.container_responses {
        let got: Vec<(String, String)> = c
            .mounts
            .iter()
            .map(|m| (m.container_path.clone(), m.host_path.clone()))
            .collect();
        assert_eq!(got, expected);
        assert!(c.mounts.iter().all(|m| m.read_only), "{:?}", c.mounts);
        assert!(c.envs.is_empty() && c.devices.is_empty());
    }
    let refused = client
        .allocate(&[vec!["preload-16".to_owned()]])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("preload-16"),
        "{}",
        refused.message()
    );

    // kubelet restarts: the plugin binds and registers again.
    kubelet.restart().await.unwrap();
    let again = kubelet.wait_for_registration(2, WAIT).await.unwrap();
    assert_eq!(again.request.resource_name, "hami.io/preload");
    assert_eq!(again.generation, 1);

    let _ = stop.send(());
    task.await.unwrap().unwrap();
    assert!(
        !kubelet_dir.join("hami-preload.sock").exists(),
        "shutdown removes the socket"
    );
}

#[tokio::test]
async fn a_hook_folder_it_cannot_vouch_for_fails_the_container_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let hook = installed_hook(dir.path());
    let vgpu = hook.join("vgpu");
    let kubelet_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&kubelet_dir).unwrap();
    let kubelet = FakeKubelet::start(&kubelet_dir).await.unwrap();
    let (stop, task) = start(&args(&kubelet_dir, &hook, 4));
    kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let mut client = kubelet.plugin().await.unwrap();
    let allocate = || vec![vec!["preload-0".to_owned()]];
    assert!(client.allocate(&allocate()).await.is_ok());

    // (break the folder, what the refusal names, put it back)
    type Step = Box<dyn Fn(&Path)>;
    let cases: Vec<(Step, &str, Step)> = vec![
        (
            // A preload list naming a library the container would not get.
            Box::new(|v: &Path| {
                std::fs::write(v.join("ld.so.preload"), "/elsewhere/libvgpu.so\n").unwrap();
            }),
            "does not list exactly",
            Box::new(|_: &Path| {}),
        ),
        (
            Box::new(|v: &Path| {
                std::fs::set_permissions(
                    v.join("libvgpu.so"),
                    std::fs::Permissions::from_mode(0o666),
                )
                .unwrap();
            }),
            "has mode 666",
            Box::new(|v: &Path| {
                std::fs::set_permissions(
                    v.join("libvgpu.so"),
                    std::fs::Permissions::from_mode(0o644),
                )
                .unwrap();
            }),
        ),
        (
            Box::new(|v: &Path| {
                std::fs::rename(v.join("libhami_preload.so"), v.join("moved")).unwrap();
                std::os::unix::fs::symlink("/etc/passwd", v.join("libhami_preload.so")).unwrap();
            }),
            "is a symbolic link, not a regular file",
            Box::new(|v: &Path| {
                std::fs::remove_file(v.join("libhami_preload.so")).unwrap();
                std::fs::rename(v.join("moved"), v.join("libhami_preload.so")).unwrap();
            }),
        ),
        (
            Box::new(|v: &Path| std::fs::rename(v.join("libvgpu.so"), v.join("moved")).unwrap()),
            "is missing",
            Box::new(|v: &Path| std::fs::rename(v.join("moved"), v.join("libvgpu.so")).unwrap()),
        ),
    ];
    let good_list = std::fs::read(vgpu.join("ld.so.preload")).unwrap();
    for (break_it, named, repair) in cases {
        break_it(&vgpu);
        let refused = client.allocate(&allocate()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains(named)
                && refused.message().contains(&*vgpu.to_string_lossy()),
            "{named}: {}",
            refused.message()
        );
        repair(&vgpu);
        std::fs::write(vgpu.join("ld.so.preload"), &good_list).unwrap();
        std::fs::set_permissions(
            vgpu.join("ld.so.preload"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert!(
            client.allocate(&allocate()).await.is_ok(),
            "{named}: repaired"
        );
    }
    // node-gpus withdrawn (a node whose GPUs could not be listed): no mount of it, the rest stays.
    std::fs::remove_file(vgpu.join("node-gpus")).unwrap();
    let response = client.allocate(&allocate()).await.unwrap();
    let paths: Vec<&str> = response.container_responses[0]
        .mounts
        .iter()
        .map(|m| m.container_path.as_str())
        .collect();
    assert_eq!(paths.len(), 3, "{paths:?}");
    assert!(!paths.iter().any(|p| p.ends_with("node-gpus")));

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

#[test]
fn it_does_not_start_on_a_hook_folder_that_is_not_installed() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("hook");
    let e = preload_plugin(&args(dir.path(), &empty, 4)).unwrap_err();
    assert!(matches!(e, ServePreloadError::Hook(_)), "{e}");
    let message = e.to_string();
    assert!(
        message.contains(&*empty.join("vgpu").to_string_lossy())
            && message.contains("install-hook"),
        "{message}"
    );
    let e = preload_plugin(&args(dir.path(), Path::new("relative/hook"), 4)).unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
}

/// kubelet's pod resources API as the region exporter reads it: a fixed `List` answer.
struct PodResources(v1::ListPodResourcesResponse);

#[tonic::async_trait]
impl v1::pod_resources_lister_server::PodResourcesLister for PodResources {
    async fn list(
        &self,
        _request: tonic::Request<v1::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<v1::ListPodResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.0.clone()))
    }
}

fn holding(pod: &str, slot: &str) -> v1::PodResources {
    v1::PodResources {
        name: pod.to_owned(),
        namespace: "kai-team".to_owned(),
        containers: vec![v1::ContainerResources {
            name: "main".to_owned(),
            devices: vec![v1::ContainerDevices {
                resource_name: "hami.io/preload".to_owned(),
                device_ids: vec![slot.to_owned()],
            }],
        }],
    }
}

async fn metrics(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw
}

/// KAI containers' regions: each container holding a slot gets the slot's folder, made anew and
/// mounted read-write at /var/lib/hami-limits/region; the node exports the region written there,
/// named by kubelet's pod-resources; a slot handed on is emptied first.
#[tokio::test]
async fn kai_regions_in_slot_folders_are_exported() {
    let dir = tempfile::tempdir().unwrap();
    let hook = installed_hook(dir.path());
    let kubelet_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&kubelet_dir).unwrap();
    let kubelet = FakeKubelet::start(&kubelet_dir).await.unwrap();
    // kubelet's pod-resources socket.
    let socket = dir.path().join("pod-resources.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let answer = v1::ListPodResourcesResponse {
        pod_resources: vec![holding("kai-a", "preload-3"), holding("kai-b", "preload-7")],
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                v1::pod_resources_lister_server::PodResourcesListerServer::new(PodResources(
                    answer,
                )),
            )
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut a = args(&kubelet_dir, &hook, 16);
    a.regions = true;
    a.metrics_listen = port.to_string();
    a.pod_resources_socket = socket;
    a.node_name = Some("kai-node".to_owned());
    a.region_export.interval = 0.05;
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        hami_device_plugin::commands::serve_preload::serve_preload(&a, async {
            let _ = stopped.await;
        })
        .await
    });
    kubelet.wait_for_registration(1, WAIT).await.unwrap();
    let mut client = kubelet.plugin().await.unwrap();
    let response = client
        .allocate(&[vec!["preload-3".to_owned()], vec!["preload-7".to_owned()]])
        .await
        .unwrap();
    let regions = hook.join("regions");
    for (c, slot) in response
        .container_responses
        .iter()
        .zip(["preload-3", "preload-7"])
    {
        let m = c.mounts.last().unwrap();
        assert_eq!(
            (m.container_path.as_str(), m.host_path.as_str(), m.read_only),
            (
                "/var/lib/hami-limits/region",
                &*regions.join(slot).to_string_lossy(),
                false
            )
        );
        // Every other mount stays read-only.
        assert_eq!(c.mounts.iter().filter(|m| !m.read_only).count(), 1);
        let cache = regions.join(slot).join("usage.cache");
        assert_eq!(std::fs::read(&cache).unwrap(), b"");
        assert_eq!(
            std::fs::metadata(&cache).unwrap().permissions().mode() & 0o7777,
            0o666
        );
        assert_eq!(
            std::fs::metadata(regions.join(slot))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o755
        );
    }
    // The containers' first processes write their regions (no limits file without --pod-api:
    // the stamped limits are exported, not compared).
    let written = RegionFixture::new(&V1_2).with_limit_all(4000 << 20).bytes();
    std::fs::write(regions.join("preload-3/usage.cache"), &written).unwrap();
    std::fs::write(
        regions.join("preload-7/usage.cache"),
        RegionFixture::new(&V1_2).bytes(),
    )
    .unwrap();
    let verdict = |pod: &str, verdict: &str| {
        format!(
            "hami_limits_region_cap_verdict{{node=\"kai-node\",podnamespace=\"kai-team\",podname=\"{pod}\",ctrname=\"main\",gpu=\"0\",verdict=\"{verdict}\"}} 1"
        )
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = metrics(port).await;
        if text.contains(&verdict("kai-a", "capped"))
            && text.contains(&verdict("kai-b", "no-limit"))
        {
            assert!(text.contains("hami_limits_region_stamped_limit_bytes{node=\"kai-node\",podnamespace=\"kai-team\",podname=\"kai-a\",ctrname=\"main\",gpu=\"0\"} 4194304000"), "{text}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never exported:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The slot handed to another container (the previous one planted a link): made anew, empty,
    // the link removed as a link.
    let outside = dir.path().join("outside");
    std::fs::write(&outside, b"node file").unwrap();
    std::os::unix::fs::symlink(&outside, regions.join("preload-3/planted")).unwrap();
    client
        .allocate(&[vec!["preload-3".to_owned()]])
        .await
        .unwrap();
    let left: Vec<_> = std::fs::read_dir(regions.join("preload-3"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["usage.cache"]);
    assert_eq!(
        std::fs::read(regions.join("preload-3/usage.cache")).unwrap(),
        b""
    );
    assert_eq!(std::fs::read(&outside).unwrap(), b"node file");

    let _ = stop.send(());
    served.await.unwrap().unwrap();
}
