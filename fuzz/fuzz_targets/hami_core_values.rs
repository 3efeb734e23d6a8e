//! HAMi-core's value grammar (`strtoul(s, 0)` and the last-character suffix): never a panic; a
//! reading of "no limit" for exactly the zero/overflow/negative cases; the safe form the writer
//! uses reads exactly what it says and draws no warning.
#![no_main]

use hami_shared::hami_core::{MemoryReading, interpret_memory, interpret_sm, read_limit};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lv = read_limit(text);
    let m = interpret_memory(text);
    match m.reading {
        MemoryReading::Unlimited => assert!(lv.result == 0 || lv.number.negative),
        MemoryReading::Bytes(b) => assert_eq!(b.get(), lv.result),
    }
    let sm = interpret_sm(text);
    assert!(sm.percent >= 1 && sm.percent <= 100);
    assert_eq!(sm.throttled, sm.percent < 100);
    // The only memory spelling the writer produces.
    let safe = text.len() >= 2
        && text.ends_with('m')
        && text.as_bytes()[0] != b'0'
        && text[..text.len() - 1].bytes().all(|b| b.is_ascii_digit());
    if safe {
        if let Ok(n) = text[..text.len() - 1].parse::<u64>() {
            if let Some(bytes) = n.checked_mul(1 << 20) {
                assert_eq!(m.reading.bytes(), Some(bytes), "{text:?}");
                assert!(m.warnings.is_empty(), "{text:?}: {:?}", m.warnings);
            }
        }
    }
});
