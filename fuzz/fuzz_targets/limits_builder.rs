//! The one builder of limits files (device plugin and webhook): whatever the container spec's
//! env holds, the file it renders parses back with no diagnostic at all, carries no `0m`, no
//! leading zero, no white space and no CR, and the copied variables are the spec's LAST entries.
#![no_main]

use hami_shared::container::{COPIED_FROM_SPEC, LimitsBuilder, SpecEnv, SpecValue, spec_value};
use hami_shared::limits_file::parse;
use hami_shared::values::{MemoryLimitMib, SmLimit};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let head = lines.next().unwrap_or("");
    let mut nums = head.split(',').map(|n| n.parse::<u64>().unwrap_or(0));
    let mem = nums.next().unwrap_or(0);
    let sm = nums.next().unwrap_or(0);
    // Env entries: NAME=VALUE (literal) or NAME (valueFrom); names drawn from the copied set.
    let entries: Vec<SpecEnv<'_>> = lines
        .map(|l| {
            let first = l.bytes().next().unwrap_or(0);
            let name = COPIED_FROM_SPEC[first as usize % COPIED_FROM_SPEC.len()];
            let rest = l.get(1..).unwrap_or("");
            let value = rest.strip_prefix('=');
            SpecEnv { name, value }
        })
        .collect();
    let mut b = LimitsBuilder::new("c");
    if let Ok(m) = MemoryLimitMib::new(mem) {
        let _ = b.memory_limit(Some((mem % 16) as usize), m);
    }
    if let Ok(s) = SmLimit::new(u32::try_from(sm % 128).unwrap_or(0)) {
        b.sm_limit(s);
    }
    b.copy_from_spec(&entries);
    let (file, _warnings) = b.finish();
    let rendered = file.render();
    let parsed = parse(&rendered);
    assert!(
        parsed.diagnostics.is_empty(),
        "{rendered:?}: {:?}",
        parsed.diagnostics
    );
    for (k, v) in file.iter() {
        let v = v.to_string();
        let v = v.as_str();
        assert!(
            !v.is_empty() && !v.contains(|c: char| c.is_whitespace() || c.is_control()),
            "{k}={v:?}"
        );
        assert_ne!(v, "0m");
        if v.len() > 1 && v.as_bytes()[0] == b'0' && v.as_bytes()[1].is_ascii_digit() {
            panic!("leading zero: {k}={v:?}");
        }
        assert!(
            !(v.starts_with("-0") && v.len() > 2),
            "leading zero: {k}={v:?}"
        );
    }
    for key in COPIED_FROM_SPEC {
        if let Some(v) = file.text(key) {
            assert_eq!(spec_value(&entries, key), SpecValue::Literal(&v), "{key}");
        }
    }
});
