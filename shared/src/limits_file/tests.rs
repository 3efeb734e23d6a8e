use super::*;
use crate::values::MemoryLimitMib;
use hami_preload_core::fraction::MAX_PLACES;

#[test]
fn renders_sorted_with_format_line() {
    let mut f = LimitsFile::new();
    f.insert("CUDA_DEVICE_SM_LIMIT", "50").unwrap();
    f.insert(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "/usr/local/vgpu/usage.cache",
    )
    .unwrap();
    f.set_memory_limit(0, MemoryLimitMib::new(3000).unwrap())
        .unwrap();
    assert_eq!(f.render(), EXAMPLE);
    assert_eq!(LimitsFile::new().render(), "HAMI_LIMITS_FORMAT=1\n");
    assert!(LimitsFile::new().is_empty());
}

#[test]
fn insert_refuses_what_would_break_the_file() {
    let mut f = LimitsFile::new();
    for key in ["", "lower", "A=B", "A B", "A\nB", "A\0", "1ABC", " A", "É"] {
        assert_eq!(
            f.insert(key, "1"),
            Err(LimitsFileError::InvalidKey {
                key: key.to_owned()
            }),
            "{key:?}"
        );
    }
    for (value, what) in [
        ("a\nb", "a newline"),
        ("a\r", "a carriage return"),
        ("a\0", "a NUL byte"),
    ] {
        let err = f.insert("SOME_KEY", value).unwrap_err();
        assert!(
            matches!(&err, LimitsFileError::InvalidValue { key, what: w, .. } if key == "SOME_KEY" && *w == what)
        );
        assert!(err.to_string().contains("SOME_KEY"));
    }
    for value in [
        "04000m", "3000", "3000Mi", "0m", "-1", "0x10m", "1.5g", " 1m",
    ] {
        let err = f.insert("CUDA_DEVICE_MEMORY_LIMIT_0", value).unwrap_err();
        assert!(
            matches!(err, LimitsFileError::UnsafeValue { .. }),
            "{value:?}"
        );
        assert!(err.to_string().contains("CUDA_DEVICE_MEMORY_LIMIT_0"));
    }
    for value in ["050", "101", "50m", ""] {
        assert!(
            f.insert("CUDA_DEVICE_SM_LIMIT", value).is_err(),
            "{value:?}"
        );
    }
    assert!(f.insert("CUDA_DEVICE_MEMORY_LIMIT_16", "1m").is_err());
    assert!(matches!(
        f.insert("HAMI_LIMITS_FORMAT", "2"),
        Err(LimitsFileError::ReservedKey { .. })
    ));
    assert!(f.insert("HAMI_LIMITS_FORMAT", "1").is_ok());
    assert!(matches!(
        f.insert("LONG", "x".repeat(MAX_LINE_BYTES)),
        Err(LimitsFileError::LineTooLong { .. })
    ));
    assert!(f.insert("ANY_VALUE", "has = and spaces").is_ok());
    assert_eq!(f.remove("HAMI_LIMITS_FORMAT"), None);
    assert_eq!(f.text("HAMI_LIMITS_FORMAT").as_deref(), Some("1"));
}

#[test]
fn parses_the_example_cleanly() {
    let p = parse(EXAMPLE);
    assert_eq!(p.diagnostics, vec![]);
    assert_eq!(p.format, Some(1));
    assert_eq!(
        p.entries
            .get("CUDA_DEVICE_MEMORY_LIMIT_0")
            .map(String::as_str),
        Some("3000m")
    );
}

/// The file of a KAI gpu-fraction container in file delivery, as the webhook projects it.
const FRACTION_FILE: &str = "CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_GPU_FRACTION=0.25\n\
    HAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n";

#[test]
fn per_node_fraction_keys_are_accepted_and_check_clean() {
    let mut f = LimitsFile::new();
    f.insert("CUDA_DEVICE_MEMORY_LIMIT", "4096m").unwrap();
    f.insert("HAMI_GPU_FRACTION", "0.25").unwrap();
    f.insert("HAMI_NODE_GPUS", "/usr/local/vgpu/node-gpus")
        .unwrap();
    assert_eq!(f.render(), FRACTION_FILE);
    let p = parse(FRACTION_FILE);
    assert_eq!(p.diagnostics, vec![], "{FRACTION_FILE}");
    assert_eq!(p.format, Some(1));
    assert_eq!(p.entries["HAMI_GPU_FRACTION"], "0.25");
    // The longest canonical fraction: 64 places.
    let longest = format!("0.{}1", "0".repeat(MAX_PLACES - 1));
    assert!(f.insert("HAMI_GPU_FRACTION", longest.as_str()).is_ok());
    assert!(parse(&f.render()).is_clean());
    assert!(GPU_FRACTION_FORM.contains(&MAX_PLACES.to_string()));
}

#[test]
fn per_node_fraction_keys_in_another_form_are_refused_and_warned_about() {
    let too_long = format!("0.{}1", "0".repeat(MAX_PLACES));
    for value in [
        "0.50",
        ".5",
        "0.",
        "1.0",
        "5e-1",
        "0.5 ",
        "0,5",
        "00.5",
        too_long.as_str(),
    ] {
        let mut f = LimitsFile::new();
        let err = f.insert("HAMI_GPU_FRACTION", value).unwrap_err();
        assert!(
            err.to_string().contains("HAMI_GPU_FRACTION")
                && err.to_string().contains(GPU_FRACTION_FORM),
            "{value:?}: {err}"
        );
        let text = format!(
            "CUDA_DEVICE_MEMORY_LIMIT=1m\nHAMI_GPU_FRACTION={value}\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/n\n"
        );
        let p = parse(&text);
        assert_eq!(p.diagnostics.len(), 1, "{value:?}: {:?}", p.diagnostics);
        let d = &p.diagnostics[0];
        assert_eq!((d.line, d.severity), (2, Severity::Warning));
        for needle in [
            GPU_FRACTION_FORM,
            "preload library ignores it",
            "CUDA_DEVICE_MEMORY_LIMIT",
        ] {
            assert!(d.message.contains(needle), "{needle}: {}", d.message);
        }
    }
    let too_long = format!("/{}", "a".repeat(4095));
    for value in [
        "",
        "relative/node-gpus",
        "/with space",
        "/tab\there",
        "~/node-gpus",
        too_long.as_str(),
    ] {
        let mut f = LimitsFile::new();
        let err = f.insert("HAMI_NODE_GPUS", value).unwrap_err();
        assert!(
            err.to_string()
                .contains("not an absolute path without white space"),
            "{value:?}: {err}"
        );
        let text = format!(
            "CUDA_DEVICE_MEMORY_LIMIT=1m\nHAMI_GPU_FRACTION=0.5\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS={value}\n"
        );
        let p = parse(&text);
        assert_eq!(p.diagnostics.len(), 1, "{value:?}: {:?}", p.diagnostics);
        assert_eq!(p.diagnostics[0].line, 4);
        assert!(
            p.diagnostics[0]
                .message
                .contains("cannot read the node GPU file"),
            "{:?}",
            p.diagnostics
        );
    }
}

#[test]
fn one_per_node_key_without_the_other_is_reported() {
    let p = parse("CUDA_DEVICE_MEMORY_LIMIT=4096m\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\n");
    assert_eq!(p.diagnostics.len(), 1, "{:?}", p.diagnostics);
    assert_eq!(p.diagnostics[0].line, 2);
    assert!(
        p.diagnostics[0]
            .message
            .starts_with("HAMI_GPU_FRACTION without HAMI_NODE_GPUS: "),
        "{:?}",
        p.diagnostics
    );
    let p = parse("HAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/usr/local/vgpu/node-gpus\n");
    assert_eq!(p.diagnostics.len(), 1, "{:?}", p.diagnostics);
    assert_eq!(p.diagnostics[0].line, 2);
    assert!(
        p.diagnostics[0]
            .message
            .starts_with("HAMI_NODE_GPUS without HAMI_GPU_FRACTION: "),
        "{:?}",
        p.diagnostics
    );
    // The per-node cap replaces the global admission-time limit: a per-device one is not it.
    let p = parse(
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m\nHAMI_GPU_FRACTION=0.25\nHAMI_LIMITS_FORMAT=1\nHAMI_NODE_GPUS=/n\n",
    );
    assert_eq!(p.diagnostics.len(), 1, "{:?}", p.diagnostics);
    assert_eq!(p.diagnostics[0].line, 2);
    assert!(
        p.diagnostics[0]
            .message
            .starts_with("HAMI_GPU_FRACTION without CUDA_DEVICE_MEMORY_LIMIT: "),
        "{:?}",
        p.diagnostics
    );
}

#[test]
fn uncapped_is_always_reported_with_its_reason() {
    use crate::names::UNCAPPED_REASONS;
    for reason in UNCAPPED_REASONS {
        let mut f = LimitsFile::new();
        f.insert("HAMI_UNCAPPED", reason).unwrap();
        let text = f.render();
        assert_eq!(
            text,
            format!("HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED={reason}\n")
        );
        let p = parse(&text);
        assert_eq!(p.diagnostics.len(), 1, "{:?}", p.diagnostics);
        let d = &p.diagnostics[0];
        assert_eq!((d.line, d.severity), (2, Severity::Warning));
        let why = uncapped_reason(reason).unwrap();
        for needle in [
            "runs without a GPU memory cap",
            "kai.missingBasis is warn",
            why,
            "kai.perGpuVramMib",
        ] {
            assert!(d.message.contains(needle), "{needle}: {}", d.message);
        }
    }
    // A label the webhook never writes is still a missing cap.
    let p = parse("HAMI_LIMITS_FORMAT=1\nHAMI_UNCAPPED=some-day\n");
    assert!(
        p.diagnostics[0]
            .message
            .contains("not one the webhook writes"),
        "{:?}",
        p.diagnostics
    );
    for bad in ["", "No-Source", "no source", "-x", "x-", "a\u{e9}"] {
        assert!(
            LimitsFile::new().insert("HAMI_UNCAPPED", bad).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn value_keeps_later_equals_signs() {
    let p = parse("A=b=c\nHAMI_LIMITS_FORMAT=1\n");
    assert_eq!(p.entries["A"], "b=c");
    assert!(p.is_clean());
}
