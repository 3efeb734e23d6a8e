//! KAI's `gpu-fraction` and `gpu-memory` parsers: never a panic; an accepted fraction lies in
//! (0, 1) and scales any VRAM to at most that VRAM, monotonically; on short plain decimal forms
//! the parser accepts exactly what a correctly rounded `f64` reads strictly between 0 and 1.
#![no_main]

use hami_webhook::policy::kai::quantity::{Fraction, parse_gpu_memory};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(f) = Fraction::parse(text) {
        let mut last = 0;
        for mib in [0u64, 1, 1024, 81_920, 143_771, u64::MAX >> 20] {
            let got = f.of(mib);
            assert!(got <= mib, "{text:?} x {mib} = {got}");
            assert!(got >= last || mib == 0, "{text:?}: not monotone at {mib}");
            last = got;
        }
        // Strictly below 1: the whole of a large GPU is never granted.
        assert!(f.of(1 << 40) < 1 << 40, "{text:?}");
    }
    // Short enough that Go's exponent cap (a `5e123456` read as `5e12345`) cannot matter; Rust's
    // f64 parser also reads "inf"/"nan" and has no `_` or hex, so only these characters.
    if text.len() < 64 && text.bytes().all(|b| b"0123456789.eE+-".contains(&b)) {
        let in_range = text.parse::<f64>().is_ok_and(|v| v > 0.0 && v < 1.0);
        assert_eq!(Fraction::parse(text).is_ok(), in_range, "{text:?}");
    }
    if let Ok(mib) = parse_gpu_memory(text) {
        assert!(mib > 0, "{text:?}");
    }
});
