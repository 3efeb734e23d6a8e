//! Exact `floor(fraction × MiB)` for the `gpu-fraction` cap, with no allocation: the webhook
//! (admission-time cap), the contract's reference decision and the preload library (per-node cap)
//! all compute it here.

/// The most decimal places a `HAMI_GPU_FRACTION` value may have. A fraction with more would cap
/// every GPU below 1 MiB (10⁻⁶⁴ × 2⁶⁴ < 1), and the webhook refuses those at admission.
pub const MAX_PLACES: usize = 64;

/// `floor(S × 10^-places × mib)` where `S` is the integer spelled by the ASCII decimal digits
/// `significant` (most significant first). Requires `significant.len() <= places` (a value below 1);
/// non-digit bytes count as 0. The result is below `mib`.
///
/// Long multiplication from the least significant digit, keeping only the carry: dropping one
/// produced digit per step divides by ten, so after `places` steps the carry is the integer part.
#[must_use]
pub fn floor_of(significant: &[u8], places: u64, mib: u64) -> u64 {
    let mut carry: u128 = 0;
    let mut steps: u64 = 0;
    for &d in significant.iter().rev() {
        let digit = if d.is_ascii_digit() {
            u128::from(d.wrapping_sub(b'0'))
        } else {
            0
        };
        // < 10 × 2^64: fits.
        carry = (digit * u128::from(mib) + carry) / 10;
        steps += 1;
    }
    // The leading zeros after the point: one more division by ten each, until nothing is left.
    while steps < places && carry > 0 {
        carry /= 10;
        steps += 1;
    }
    // carry < mib ≤ u64::MAX.
    u64::try_from(carry).unwrap_or(u64::MAX)
}

/// The digits after `0.` of a canonical `HAMI_GPU_FRACTION` value: `0.` then 1 to [`MAX_PLACES`]
/// ASCII digits, the last one not `0` (so the value is strictly between 0 and 1). `None` for
/// anything else: `.5`, `0.50`, `1.0`, `0.`, `5e-1`, white space.
#[must_use]
pub fn parse_canonical(value: &[u8]) -> Option<&[u8]> {
    let digits = value.strip_prefix(b"0.")?;
    let ok = !digits.is_empty()
        && digits.len() <= MAX_PLACES
        && digits.iter().all(u8::is_ascii_digit)
        && digits.last() != Some(&b'0');
    ok.then_some(digits)
}

/// `floor(fraction × mib)` for canonical digits (see [`parse_canonical`]).
#[must_use]
pub fn of_mib(canonical_digits: &[u8], mib: u64) -> u64 {
    floor_of(canonical_digits, canonical_digits.len() as u64, mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples() {
        assert_eq!(of_mib(b"5", 143_771), 71_885);
        assert_eq!(of_mib(b"5", 81_920), 40_960);
        assert_eq!(of_mib(b"25", 15_360), 3_840);
        assert_eq!(of_mib(b"999", 1), 0);
        assert_eq!(of_mib(b"1", u64::MAX), u64::MAX / 10);
        assert_eq!(floor_of(b"5", 3, 143_771), 718); // 0.005
        assert_eq!(floor_of(b"5", 1_000_000, u64::MAX), 0);
        assert_eq!(parse_canonical(b"0.5"), Some(&b"5"[..]));
        assert_eq!(parse_canonical(b"0.05"), Some(&b"05"[..]));
        for bad in [
            &b"0.50"[..],
            b".5",
            b"0.",
            b"1.5",
            b"0.5 ",
            b" 0.5",
            b"0.0",
            b"5e-1",
            b"0,5",
            b"00.5",
        ] {
            assert_eq!(
                parse_canonical(bad),
                None,
                "{:?}",
                core::str::from_utf8(bad)
            );
        }
        let long = [b'1'; MAX_PLACES + 1];
        let mut v = [0u8; MAX_PLACES + 3];
        v[..2].copy_from_slice(b"0.");
        v[2..].copy_from_slice(&long);
        assert_eq!(parse_canonical(&v), None);
        assert!(parse_canonical(&v[..MAX_PLACES + 2]).is_some());
    }
}
