//! `floor(fraction × MiB)` against a big-integer reference, over every length of fraction the
//! limits file may carry and the whole range of `u64`.

use hami_preload_core::fraction::{MAX_PLACES, floor_of, of_mib, parse_canonical};
use num_bigint::BigUint;
use proptest::prelude::*;

fn reference(significant: &str, places: u32, mib: u64) -> u64 {
    let s = BigUint::parse_bytes(significant.as_bytes(), 10).unwrap();
    let v = (s * BigUint::from(mib)) / BigUint::from(10u32).pow(places);
    u64::try_from(v).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]
    #[test]
    fn canonical_fractions(digits in "[0-9]{0,63}[1-9]", mib in any::<u64>()) {
        let text = format!("0.{digits}");
        let parsed = parse_canonical(text.as_bytes()).unwrap();
        prop_assert_eq!(of_mib(parsed, mib), reference(&digits, digits.len() as u32, mib));
    }

    #[test]
    fn small_realistic_values(digits in "[0-9]{0,5}[1-9]", mib in 1u64..20_000_000) {
        prop_assert_eq!(of_mib(digits.as_bytes(), mib), reference(&digits, digits.len() as u32, mib));
    }

    #[test]
    fn significant_digits_with_leading_zeros(sig in "[1-9][0-9]{0,20}", zeros in 0u32..80, mib in any::<u64>()) {
        let places = sig.len() as u32 + zeros;
        prop_assert_eq!(floor_of(sig.as_bytes(), u64::from(places), mib), reference(&sig, places, mib));
    }
}

#[test]
fn bounds() {
    let max = "9".repeat(MAX_PLACES);
    assert_eq!(
        of_mib(max.as_bytes(), u64::MAX),
        reference(&max, MAX_PLACES as u32, u64::MAX)
    );
    assert_eq!(of_mib(max.as_bytes(), u64::MAX), u64::MAX - 1);
    assert_eq!(of_mib(b"1", 9), 0);
    assert_eq!(of_mib(b"1", 10), 1);
}
