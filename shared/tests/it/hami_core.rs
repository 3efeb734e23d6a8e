//! HAMi-core's value grammar: our `strtoul` against the C library's, and the interpretation of
//! memory and SM values over arbitrary input.
// Calling the C library's strtoul is the point of the differential test.
#![allow(unsafe_code)]

use std::ffi::CString;

use hami_shared::hami_core::{MemoryReading, interpret_memory, interpret_sm, strtoul};
use proptest::prelude::*;

/// `strtoul(s, &end, 0)` from the C library: (value, end offset).
fn c_strtoul(s: &str) -> (u64, usize) {
    let c = CString::new(s).unwrap();
    let mut end: *mut libc::c_char = std::ptr::null_mut();
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; `end` is written by
    // strtoul to point into it.
    let v = unsafe { libc::strtoul(c.as_ptr(), &mut end, 0) };
    // SAFETY: `end` points into the same allocation as `c`.
    let off = unsafe { end.offset_from(c.as_ptr()) };
    (v as u64, usize::try_from(off).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn strtoul_matches_the_c_library(s in "[ \t+\\-0-9a-fA-FxXkKmMgGi.\r]{0,14}") {
        let ours = strtoul(s.as_bytes());
        prop_assert_eq!((ours.value, ours.end), c_strtoul(&s), "{:?}", s);
    }

    #[test]
    fn strtoul_matches_on_long_numbers(s in "-?(0[xX])?[0-9a-f]{15,25}") {
        let ours = strtoul(s.as_bytes());
        prop_assert_eq!((ours.value, ours.end), c_strtoul(&s), "{:?}", s);
    }

    /// The safe form is read exactly, without a warning.
    #[test]
    fn safe_memory_form_reads_exactly(n in 1u64..=(u64::MAX >> 20)) {
        let i = interpret_memory(&format!("{n}m"));
        prop_assert!(i.warnings.is_empty(), "{:?}", i);
        prop_assert_eq!(i.reading.bytes(), Some(n << 20));
    }

    /// Anything else never panics, and a value read as no limit (other than the bare HAMi
    /// conventions) always carries a warning saying so.
    #[test]
    fn interpretation_is_total(s in "\\PC{0,16}") {
        let m = interpret_memory(&s);
        if m.reading == MemoryReading::Unlimited {
            prop_assert!(!m.warnings.is_empty(), "{:?} read as no limit without a warning", s);
        }
        let sm = interpret_sm(&s);
        prop_assert!(sm.percent >= 1 && sm.percent <= 100);
    }
}
