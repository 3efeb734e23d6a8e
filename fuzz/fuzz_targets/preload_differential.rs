//! The preload library's own decision (`hami_preload_core`, no `std`, the code the shipped
//! `libhami_preload.so` runs) against the reference (`hami_preload_reference`, over the contract's
//! parsers): the same bytes must give the same decision (untouched and why, or skipped lines and
//! the per-node outcome) and the same environment.
//!
//! Input: a flag byte (bit 0 truncated read; bit 1 node file missing; bit 2 `/dev` unreadable;
//! bit 3 an inconsistent device node), a byte of visible GPU minors (bits 0..=3: minors 0..=3,
//! bit 4: minor 254), then the limits file, the node GPU file and the inherited variable names,
//! separated by 0xff bytes (names by 0xfe).
#![no_main]

use hami_preload_reference::library_env;
use hami_preload_reference::{Kept, NodeView, VisibleGpus};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (flags, rest) = data.split_first().map_or((0, data), |(f, r)| (*f, r));
    let (minors, rest) = rest.split_first().map_or((0, rest), |(m, r)| (*m, r));
    let mut parts = rest.splitn(3, |b| *b == 0xff);
    let file = parts.next().unwrap_or_default();
    let node = parts.next().unwrap_or_default();
    let names = parts.next().unwrap_or_default();
    let inherited: Vec<(Vec<u8>, Vec<u8>)> = names
        .split(|b| *b == 0xfe)
        .filter(|n| !n.is_empty() && !n.contains(&b'=') && !n.contains(&0))
        .map(|n| (n.to_vec(), b"x".to_vec()))
        .collect();
    let mut visible = VisibleGpus::new();
    for m in 0..4 {
        if minors & (1 << m) != 0 {
            visible.add(m);
        }
    }
    if minors & 0x10 != 0 {
        visible.add(254);
    }
    if flags & 8 != 0 {
        visible.set_mismatch();
    }
    let view = NodeView {
        node_file: if flags & 2 != 0 {
            Err(Kept::NodeFileMissing)
        } else {
            Ok(node)
        },
        devices: if flags & 4 != 0 {
            Err(Kept::DeviceScanFailed)
        } else {
            Ok(visible)
        },
    };
    let truncated = flags & 1 != 0;
    let want = library_env::reference(file, truncated, &inherited, &view);
    let got = library_env::library(file, truncated, &inherited, &view);
    assert_eq!(
        got,
        want,
        "file {:?} node {:?}",
        String::from_utf8_lossy(file),
        String::from_utf8_lossy(node)
    );
});
