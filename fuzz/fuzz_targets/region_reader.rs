//! HAMi-core's shared region reader and the verdict over it: never a panic, whatever the bytes;
//! what it accepts respects the slot array's bound; a region written by the fixture generator
//! reads back as written.
//!
//! Input: the first byte picks the mode. Even: the rest is a region file as is (short files,
//! headers). Odd: a region is generated from the next bytes (layout, limit, SM limit, slots,
//! proc_num), then patched with (offset, byte) pairs and cut to a length, so that the fuzzer
//! reaches fields two megabytes into the file from a small seed.
#![no_main]

use hami_shared::region::fixture::{FixtureSlot, RegionFixture};
use hami_shared::region::layout::{LAYOUTS, SLOT_COUNT};
use hami_shared::region::{FileLimits, Liveness, RegionError, RegionErrorKind, judge, parse};
use libfuzzer_sys::fuzz_target;

fn u32_at(data: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    for (i, v) in b.iter_mut().enumerate() {
        *v = data.get(at + i).copied().unwrap_or(0);
    }
    u32::from_le_bytes(b)
}

fn check(bytes: &[u8]) {
    let parsed = parse(bytes);
    if let Ok(r) = &parsed {
        assert!(r.procs.len() <= SLOT_COUNT);
        assert!(r.uuids.len() <= 16);
        assert_eq!(r.length, bytes.len());
    }
    let as_read = parsed.map_err(|e| RegionError {
        path: "fuzz".to_owned(),
        kind: RegionErrorKind::Parse(e),
    });
    let file = FileLimits::from_entries(
        &[("CUDA_DEVICE_MEMORY_LIMIT_0".to_owned(), "3000m".to_owned())]
            .into_iter()
            .collect(),
        None,
    );
    let v = judge(as_read.as_ref(), Some(&file), |p| {
        if p.pid % 2 == 0 {
            Liveness::Dead
        } else {
            Liveness::Alive
        }
    });
    assert!(v.gpus.len() <= 16);
    let _ = serde_json::to_string(&v);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        check(data);
        return;
    };
    if mode % 2 == 0 {
        check(rest);
        return;
    }
    let layout = LAYOUTS[usize::from(rest.first().copied().unwrap_or(0)) % LAYOUTS.len()];
    let mut f = RegionFixture::new(layout);
    f.limit[0] = u64::from(u32_at(rest, 1)) << 20;
    f.sm_limit[0] = u64::from(u32_at(rest, 5) % 200);
    let slots = usize::from(rest.get(9).copied().unwrap_or(0)) % 8;
    f.procs = (0..slots)
        .map(|i| {
            FixtureSlot::running(
                i as i32 + 1,
                0,
                i % 16,
                1 << 20,
                u64::from(u32_at(rest, 10)),
            )
        })
        .collect();
    let clean = f.bytes();
    let r = parse(&clean).expect("a generated region parses");
    assert_eq!(r.limit[0], f.limit[0]);
    assert_eq!(r.procs.len(), slots);
    let mut bytes = clean;
    let len = bytes.len();
    let patches = rest.get(14..).unwrap_or_default();
    let mut cut = len;
    for p in patches.chunks(5) {
        if p.len() < 5 {
            break;
        }
        let at = u32_at(p, 0) as usize;
        if at % 2 == 1 && p[4] == 0xff {
            cut = at % (len + 1);
        } else if let Some(b) = bytes.get_mut(at % len) {
            *b = p[4];
        }
    }
    bytes.truncate(cut);
    check(&bytes);
});
