//! The preload library's decision (`hami_preload_core`, no `std`) against the reference
//! (`hami_preload_reference`, over the contract's parsers): for limits files, node GPU files, visible
//! devices and inherited environments built from the pieces real files are made of (and the
//! mistakes they contain), both give the same decision and the same environment. The
//! `preload_differential` fuzz target does the same over arbitrary bytes.

use hami_preload_reference::library_env;
use hami_preload_reference::{Kept, NodeView, PerNode, VisibleGpus};
use proptest::prelude::*;

fn limits_line() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("CUDA_DEVICE_MEMORY_LIMIT".to_owned()),
        (0u8..18).prop_map(|i| format!("CUDA_DEVICE_MEMORY_LIMIT_{i}")),
        Just("CUDA_DEVICE_MEMORY_LIMIT_01".to_owned()),
        Just("CUDA_DEVICE_SM_LIMIT".to_owned()),
        (0u8..17).prop_map(|i| format!("CUDA_DEVICE_SM_LIMIT_{i}")),
        Just("CUDA_DEVICE_MEMORY_SHARED_CACHE".to_owned()),
        Just("CUDA_TASK_PRIORITY".to_owned()),
        Just("CUDA_OVERSUBSCRIBE".to_owned()),
        Just("HAMI_LIMITS_FORMAT".to_owned()),
        Just("HAMI_GPU_FRACTION".to_owned()),
        Just("HAMI_NODE_GPUS".to_owned()),
        Just("LD_PRELOAD".to_owned()),
        Just("lower".to_owned()),
        Just(String::new()),
    ];
    let value = prop_oneof![
        (1u64..200_000).prop_map(|m| format!("{m}m")),
        Just("0".to_owned()),
        Just("04000m".to_owned()),
        Just("-1m".to_owned()),
        Just("lots".to_owned()),
        Just("3000m\r".to_owned()),
        Just("0.5".to_owned()),
        Just("0.25".to_owned()),
        Just("0.50".to_owned()),
        Just("0.0001".to_owned()),
        Just("0.1234567890123456789".to_owned()),
        Just("/node-gpus".to_owned()),
        Just("node-gpus".to_owned()),
        Just("1".to_owned()),
        "[ -~]{0,12}",
    ];
    prop_oneof![
        8 => (key, value).prop_map(|(k, v)| format!("{k}={v}")),
        1 => Just("# comment".to_owned()),
        1 => Just(String::new()),
        1 => "[ -~\r\u{0}]{0,16}",
    ]
}

fn file_of(lines: Vec<String>, crlf: bool, final_newline: bool) -> Vec<u8> {
    let end = if crlf { "\r\n" } else { "\n" };
    let mut text = lines.join(end);
    if final_newline && !lines.is_empty() {
        text.push_str(end);
    }
    text.into_bytes()
}

fn node_line() -> impl Strategy<Value = String> {
    let minor = prop_oneof![0u32..4, Just(254), Just(255)];
    prop_oneof![
        4 => (minor.clone(), prop_oneof![
            (1u64..200_000).prop_map(|m| m.to_string()),
            Just("0".to_owned()),
            Just("080".to_owned()),
            Just("16777217".to_owned()),
            Just("x".to_owned()),
        ])
            .prop_map(|(m, v)| format!("NVIDIA{m}_MIB={v}")),
        2 => (minor, prop_oneof![Just("GPU-a".to_owned()), Just("a b".to_owned()), Just(String::new())])
            .prop_map(|(m, v)| format!("NVIDIA{m}_UUID={v}")),
        2 => prop_oneof![Just("1"), Just("2"), Just("01")].prop_map(|v| format!("HAMI_NODE_GPUS_FORMAT={v}")),
        1 => Just("NVIDIA01_MIB=5".to_owned()),
        1 => Just("OTHER=1".to_owned()),
        1 => Just(String::new()),
    ]
}

fn node_file() -> impl Strategy<Value = Result<Vec<u8>, Kept>> {
    prop_oneof![
        6 => (prop::collection::vec(node_line(), 0..8), any::<bool>(), any::<bool>())
            .prop_map(|(l, crlf, nl)| Ok(file_of(l, crlf, nl))),
        1 => Just(Err(Kept::NodeFileMissing)),
        1 => Just(Err(Kept::NodeFileUnreadable)),
        1 => Just(Ok(vec![b'A'; 5000])),
    ]
}

fn devices() -> impl Strategy<Value = Result<VisibleGpus, Kept>> {
    prop_oneof![
        8 => (prop::collection::vec(prop_oneof![0u32..4, Just(254)], 0..3), prop::bool::weighted(0.1))
            .prop_map(|(minors, mismatch)| {
                let mut v = VisibleGpus::new();
                for m in minors {
                    v.add(m);
                }
                if mismatch {
                    v.set_mismatch();
                }
                Ok(v)
            }),
        1 => Just(Err(Kept::DeviceScanFailed)),
    ]
}

fn inherited() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    prop::collection::vec(
        (
            prop_oneof![
                Just("CUDA_DEVICE_MEMORY_LIMIT"),
                Just("CUDA_DEVICE_MEMORY_LIMIT_0"),
                Just("CUDA_DEVICE_MEMORY_LIMIT_99"),
                Just("CUDA_DEVICE_SM_LIMIT"),
                Just("LIBCUDA_LOG_LEVEL"),
                Just("NVIDIA_VISIBLE_DEVICES"),
                Just("PATH"),
            ],
            "[a-z0-9]{0,4}",
        )
            .prop_map(|(k, v)| (k.as_bytes().to_vec(), v.into_bytes())),
        0..5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]
    #[test]
    fn the_library_decides_as_the_reference(
        lines in prop::collection::vec(limits_line(), 0..10),
        crlf in any::<bool>(),
        final_newline in any::<bool>(),
        truncated in prop::bool::weighted(0.1),
        node in node_file(),
        devices in devices(),
        env in inherited(),
    ) {
        let file = file_of(lines, crlf, final_newline);
        let node_bytes;
        let view = NodeView {
            node_file: match &node {
                Ok(b) => {
                    node_bytes = b.clone();
                    Ok(&node_bytes[..])
                }
                Err(k) => Err(*k),
            },
            devices,
        };
        let want = library_env::reference(&file, truncated, &env, &view);
        let got = library_env::library(&file, truncated, &env, &view);
        prop_assert_eq!(&got, &want, "file {:?}", String::from_utf8_lossy(&file));
    }
}

fn kai_file() -> impl Strategy<Value = Vec<u8>> {
    (
        1u64..100_000,
        prop_oneof![
            Just("0.5".to_owned()),
            Just("0.25".to_owned()),
            Just("0.333".to_owned()),
            Just("0.0000001".to_owned()),
            Just("0.50".to_owned()),
            "0\\.[0-9]{1,6}"
        ],
        prop::collection::vec(limits_line(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(cap, fraction, extra, path)| {
            let mut lines = vec![
                format!("CUDA_DEVICE_MEMORY_LIMIT={cap}m"),
                format!("HAMI_GPU_FRACTION={fraction}"),
                "HAMI_LIMITS_FORMAT=1".to_owned(),
            ];
            if path {
                lines.push("HAMI_NODE_GPUS=/usr/local/vgpu/node-gpus".to_owned());
            }
            lines.extend(extra);
            file_of(lines, false, true)
        })
}

fn kai_node_file() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::bool::weighted(0.9),
        prop::collection::vec((0u32..4, 1u64..200_000), 0..4),
        prop::collection::vec(node_line(), 0..2),
    )
        .prop_map(|(format, gpus, extra)| {
            let mut lines = Vec::new();
            if format {
                lines.push("HAMI_NODE_GPUS_FORMAT=1".to_owned());
            }
            for (m, mib) in gpus {
                lines.push(format!("NVIDIA{m}_MIB={mib}"));
                lines.push(format!("NVIDIA{m}_UUID=GPU-{m}"));
            }
            lines.extend(extra);
            file_of(lines, false, true)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]
    /// Files shaped like the webhook's for a KAI `gpu-fraction` container, so that the per-node
    /// step runs to its end most of the time.
    #[test]
    fn kai_containers_get_the_same_per_node_cap(
        file in kai_file(),
        node in kai_node_file(),
        devices in devices(),
        env in inherited(),
    ) {
        let view = NodeView { node_file: Ok(&node[..]), devices };
        let want = library_env::reference(&file, false, &env, &view);
        let got = library_env::library(&file, false, &env, &view);
        prop_assert_eq!(&got, &want, "file {:?} node {:?}", String::from_utf8_lossy(&file), String::from_utf8_lossy(&node));
    }
}

/// The cases the preload library must get right, with the figures they must give: a 0.5 container on a 141 GiB card
/// (143,771 MiB as NVML reports an H200) and on an 80 GiB card, several visible GPUs, missing and
/// malformed node files, a spoofed environment.
#[test]
fn named_cases() {
    let file = b"CUDA_DEVICE_MEMORY_LIMIT=40779m\nHAMI_GPU_FRACTION=0.5\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n";
    let node = b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA0_MIB=81559\nNVIDIA0_UUID=GPU-a\nNVIDIA3_MIB=143771\nNVIDIA3_UUID=GPU-b\n";
    let spoof = vec![
        (b"CUDA_DEVICE_MEMORY_LIMIT".to_vec(), b"999g".to_vec()),
        (b"NVIDIA_VISIBLE_DEVICES".to_vec(), b"all".to_vec()),
    ];
    let visible = |minors: &[u32]| {
        let mut v = VisibleGpus::new();
        for m in minors {
            v.add(*m);
        }
        Ok(v)
    };
    /// What, the node file, the devices, the cap wanted, the per-node outcome.
    type Case<'a> = (
        &'a str,
        Result<&'a [u8], Kept>,
        Result<VisibleGpus, Kept>,
        &'a str,
        Option<PerNode>,
    );
    let cases: &[Case<'_>] = &[
        (
            "141 GiB card",
            Ok(node),
            visible(&[3]),
            "71885m",
            Some(PerNode::Applied {
                mib: 71_885,
                gpu_mib: 143_771,
                gpus: 1,
            }),
        ),
        (
            "80 GiB card",
            Ok(node),
            visible(&[0]),
            "40779m",
            Some(PerNode::Applied {
                mib: 40_779,
                gpu_mib: 81_559,
                gpus: 1,
            }),
        ),
        (
            "both cards: the smaller",
            Ok(node),
            visible(&[0, 3]),
            "40779m",
            Some(PerNode::Applied {
                mib: 40_779,
                gpu_mib: 81_559,
                gpus: 2,
            }),
        ),
        (
            "no node file",
            Err(Kept::NodeFileMissing),
            visible(&[3]),
            "40779m",
            Some(PerNode::Kept(Kept::NodeFileMissing)),
        ),
        (
            "malformed node file",
            Ok(b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIA3_MIB=143,771\n"),
            visible(&[3]),
            "40779m",
            Some(PerNode::Kept(Kept::NodeFileInvalid)),
        ),
        (
            "a visible GPU the file does not list",
            Ok(node),
            visible(&[3, 5]),
            "40779m",
            Some(PerNode::Kept(Kept::GpuNotInFile(5))),
        ),
        (
            "no device node",
            Ok(node),
            visible(&[]),
            "40779m",
            Some(PerNode::Kept(Kept::NoVisibleGpu)),
        ),
        (
            // Found by the preload_differential fuzz target: a malformed line that quotes
            // HAMI_LIMITS_FORMAT made the reference call the file valid.
            "a malformed node file line naming HAMI_LIMITS_FORMAT",
            Ok(b"HAMI_NODE_GPUS_FORMAT=1\nNVIDIAHAMI_LIMITS_FORMAT771\nNVIDIA3_UUID=GPU"),
            visible(&[3]),
            "40779m",
            Some(PerNode::Kept(Kept::NodeFileInvalid)),
        ),
    ];
    for (what, node_file, devices, want, per_node) in cases {
        let view = NodeView {
            node_file: *node_file,
            devices: *devices,
        };
        let got = library_env::library(file, false, &spoof, &view);
        assert_eq!(
            got,
            library_env::reference(file, false, &spoof, &view),
            "{what}"
        );
        assert_eq!(got.decision, Ok((0, *per_node)), "{what}");
        assert_eq!(
            got.env
                .get(&b"CUDA_DEVICE_MEMORY_LIMIT"[..])
                .map(Vec::as_slice),
            Some(want.as_bytes()),
            "{what}"
        );
        assert_eq!(
            got.env
                .get(&b"NVIDIA_VISIBLE_DEVICES"[..])
                .map(Vec::as_slice),
            Some(&b"all"[..])
        );
        assert!(!got.env.contains_key(&b"HAMI_GPU_FRACTION"[..]), "{what}");
    }
}
