//! KAI's `gpu-memory` and `gpu-fraction` values, parsed strictly and turned into MiB with exact
//! decimal arithmetic.
//! The tables of accepted and refused values stay beside the parser whose Go/KAI compatibility they
//! pin.
//!
//! Why not `f64`: `0.1 × 16384` in binary floating point is `1638.4000000000001`, harmless, but
//! `0.7 × 10` is `7.000000000000001` while `0.29 × 100` is `28.999999999999996`, which floors to
//! 28 instead of 29. A cap must be exactly the requested share, so the fraction is kept as its
//! decimal digits and multiplied as an integer.
//!
//! Why not string concatenation: HAMi-core reads memory values with `strtoul(s, _, 0)`, so the seed
//! fork's `04000` + `m` meant octal 2048 MiB. Every value here is re-formatted from the number.

use std::fmt;

use hami_shared::limits_file::GpuFraction;

/// Why a `gpu-memory` or `gpu-fraction` value is refused. `Display` says what is wrong and what
/// would be accepted; the caller prefixes the pod and annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KaiValueError {
    /// Empty value.
    #[error("is empty")]
    Empty,
    /// `gpu-memory` is not `[0-9]+`.
    #[error(
        "is not a positive decimal integer of MiB (e.g. \"4000\"; no sign, unit, space or fraction)"
    )]
    MemoryNotInteger,
    /// `gpu-memory` is 0.
    #[error("is zero; a GPU memory request must be at least 1 MiB")]
    MemoryZero,
    /// `gpu-memory` is larger than any GPU could have.
    #[error("is larger than the largest memory limit HAMi-core can express ({max} MiB)")]
    MemoryTooLarge {
        /// The largest accepted value.
        max: u64,
    },
    /// `gpu-fraction` is not a decimal number as KAI reads it (NaN, Inf, hex, `_`, space, unit ...).
    #[error(
        "is not a decimal number (e.g. \"0.25\", \".5\", \"25e-2\"; no unit, space, `_`, hex, NaN or Inf)"
    )]
    FractionNotDecimal,
    /// `gpu-fraction` is a decimal number outside (0, 1).
    #[error("is not strictly between 0 and 1")]
    FractionOutOfRange,
    /// `gpu-fraction` lies in (0, 1) but a 64-bit float, as KAI reads it, rounds it to 0 or 1.
    #[error(
        "is not strictly between 0 and 1 as KAI reads it (a 64-bit float rounds it to 0 or 1); use fewer digits"
    )]
    FractionRoundsToBound,
}

/// A `gpu-fraction` as an exact decimal: `digits × 10^exponent`, `digits` without leading or
/// trailing zeros, value strictly between 0 and 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fraction {
    /// Significant decimal digits (ASCII), no leading or trailing zero, never empty.
    digits: Box<str>,
    /// Decimal exponent of the last digit; always negative for a value below 1.
    exponent: i64,
}

/// Go's `strconv.ParseFloat` stops accumulating an exponent once it reaches this (its `readFloat`:
/// `if e < 10000 { e = e*10 + digit }`), so `5e123456` is read as `5e12345`. Mirrored so that a
/// value means here what it means to KAI.
const GO_EXPONENT_CAP: i64 = 10_000;

/// `1 − 2⁻⁵⁴`, the midpoint between 1 and the largest `f64` below it, as its decimal digits after
/// `0.` (exact: 2⁻⁵⁴ has 54 decimal places). A value at or above it is read as `1.0` by
/// `strconv.ParseFloat` (round half to even), which KAI refuses.
const ONE_MINUS_HALF_ULP: &str = "999999999999999944488848768742172978818416595458984375";

impl Fraction {
    /// Parse a `gpu-fraction` value exactly as KAI's admission validator accepts it: Go's
    /// `strconv.ParseFloat(value, 64)` must read it as a number strictly between 0 and 1, and
    /// `resource.ParseQuantity(value)` must accept it (KAI ≥ v0.14 checks both). Together:
    ///
    /// `[+-]? digits? ('.' digits?)? ([eE] [+-]? digits)?` with at least one mantissa digit: leading
    /// zeros in mantissa and exponent, `E`, `.5`, `5.`, `+0.5`. Refused: empty, space, units,
    /// `NaN`/`Inf` (ParseQuantity refuses them; older KAI let `NaN` through), hexadecimal floats
    /// (`0x1p-2`) and `_` digit separators (ParseFloat reads both, ParseQuantity refuses them, so
    /// current KAI does too), and any value that `f64` rounds to 0 or 1 (`0.99999999999999999`).
    ///
    /// The value kept is the exact decimal written, not its `f64` rounding.
    ///
    /// # Errors
    /// [`KaiValueError`] naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, KaiValueError> {
        let written = Written::scan(text)?;
        if written.negative {
            // Negative (`-0` included) or zero alike: out of range.
            return Err(KaiValueError::FractionOutOfRange);
        }
        let (significant, exponent) = written.significant()?;
        // digits × 10^exponent < 1  ⟺  len(digits) + exponent ≤ 0 (digits has no leading zero).
        let len =
            i64::try_from(significant.len()).map_err(|_| KaiValueError::FractionOutOfRange)?;
        let magnitude = len + exponent;
        if magnitude > 0 {
            return Err(KaiValueError::FractionOutOfRange);
        }
        // In [0.1, 1): f64 reads it as 1.0 when at or above the midpoint below 1.
        if magnitude == 0 && significant.as_str() >= ONE_MINUS_HALF_ULP {
            return Err(KaiValueError::FractionRoundsToBound);
        }
        // Below 10^-323: f64 reads it as 0 when at or below 2^-1075 (half the smallest subnormal).
        if magnitude < -323
            || (magnitude == -323 && significant.as_bytes() <= &half_min_subnormal()[..])
        {
            return Err(KaiValueError::FractionRoundsToBound);
        }
        Ok(Self {
            digits: significant.into(),
            exponent,
        })
    }

    /// `floor(self × mib)`, exactly, by [`hami_preload_core::fraction::floor_of`]: the preload
    /// library computes its per-node cap with the same function, so the two never disagree.
    #[must_use]
    pub fn of(&self, mib: u64) -> u64 {
        // self < 1, so `digits` has at most `places` digits (its last one at 10^exponent < 1).
        let places = self.exponent.unsigned_abs();
        hami_preload_core::fraction::floor_of(self.digits.as_bytes(), places, mib)
    }

    /// The value as the limits file's `HAMI_GPU_FRACTION` holds it (`0.25`: plain decimal, no
    /// trailing zero), when [`hami_preload_core::fraction::parse_canonical`] accepts it, i.e. at
    /// most [`hami_preload_core::fraction::MAX_PLACES`] places; `None` otherwise (the
    /// admission-time cap then stands alone).
    #[must_use]
    pub fn canonical(&self) -> Option<GpuFraction> {
        GpuFraction::new(&self.to_string()).ok()
    }
}

/// 2⁻¹⁰⁷⁵ = 5¹⁰⁷⁵ × 10⁻¹⁰⁷⁵: the digits of 5¹⁰⁷⁵ (752 of them, after 323 zeros following `0.`),
/// computed when a value that small is met (never in practice).
fn half_min_subnormal() -> Vec<u8> {
    // Little-endian decimal digits, times 5, 1075 times.
    let mut digits: Vec<u8> = vec![1];
    for _ in 0..1075 {
        let mut carry = 0u8;
        for d in &mut digits {
            let v = *d * 5 + carry;
            *d = v % 10;
            carry = v / 10;
        }
        if carry > 0 {
            digits.push(carry);
        }
    }
    digits.reverse();
    for d in &mut digits {
        *d += b'0';
    }
    digits
}

impl fmt::Display for Fraction {
    /// The value in plain decimal notation, e.g. `0.25`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let places = usize::try_from(self.exponent.unsigned_abs()).unwrap_or(usize::MAX);
        if places > hami_preload_core::fraction::MAX_PLACES {
            return write!(f, "{}e{}", self.digits, self.exponent);
        }
        f.write_str("0.")?;
        for _ in self.digits.len()..places {
            f.write_str("0")?;
        }
        f.write_str(&self.digits)
    }
}

/// The largest MiB value HAMi-core's `strtoul` of `<n>m` can hold without overflow.
pub const MAX_MEMORY_MIB: u64 = hami_shared::MemoryLimitMib::MAX;

/// Parse a `gpu-memory` value: a positive decimal integer of MiB; leading zeros are accepted and
/// dropped (`04000` means 4000, as KAI reads it).
///
/// # Errors
/// [`KaiValueError`] naming what is wrong.
pub fn parse_gpu_memory(text: &str) -> Result<u64, KaiValueError> {
    if text.is_empty() {
        return Err(KaiValueError::Empty);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(KaiValueError::MemoryNotInteger);
    }
    let significant = text.trim_start_matches('0');
    if significant.is_empty() {
        return Err(KaiValueError::MemoryZero);
    }
    match significant.parse::<u64>() {
        Ok(n) if n <= MAX_MEMORY_MIB => Ok(n),
        _ => Err(KaiValueError::MemoryTooLarge {
            max: MAX_MEMORY_MIB,
        }),
    }
}

/// A decimal as written, split into its parts (no value judged yet).
struct Written<'t> {
    negative: bool,
    /// The digits before the point (may be empty: `.5`).
    int_part: &'t str,
    /// The digits after the point (may be empty: `5.`).
    frac_part: &'t str,
    /// The exponent written (`e-3`: -3), capped as Go caps it.
    exponent: i64,
}

impl<'t> Written<'t> {
    /// `[+-]? digits? ('.' digits?)? ([eE] [+-]? digits)?` with at least one mantissa digit.
    fn scan(text: &'t str) -> Result<Self, KaiValueError> {
        let b = text.as_bytes();
        if b.is_empty() {
            return Err(KaiValueError::Empty);
        }
        let digits_from = |mut i: usize| {
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            i
        };
        let sign = |i: &mut usize| match b.get(*i) {
            Some(b'-') => {
                *i += 1;
                true
            }
            Some(b'+') => {
                *i += 1;
                false
            }
            _ => false,
        };
        let mut i = 0;
        let negative = sign(&mut i);
        let int_end = digits_from(i);
        let int_part = &text[i..int_end];
        i = int_end;
        let mut frac_part = "";
        if b.get(i) == Some(&b'.') {
            let end = digits_from(i + 1);
            frac_part = &text[i + 1..end];
            i = end;
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(KaiValueError::FractionNotDecimal);
        }
        let mut exponent: i64 = 0;
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            let exp_negative = sign(&mut i);
            let end = digits_from(i);
            if end == i {
                return Err(KaiValueError::FractionNotDecimal);
            }
            for &d in &b[i..end] {
                if exponent < GO_EXPONENT_CAP {
                    exponent = exponent * 10 + i64::from(d - b'0');
                }
            }
            if exp_negative {
                exponent = -exponent;
            }
            i = end;
        }
        if i != b.len() {
            return Err(KaiValueError::FractionNotDecimal);
        }
        Ok(Self {
            negative,
            int_part,
            frac_part,
            exponent,
        })
    }

    /// The value as `significant × 10^exponent`, `significant` without leading or trailing zeros.
    ///
    /// # Errors
    /// [`KaiValueError::FractionOutOfRange`] for zero (no significant digit).
    fn significant(&self) -> Result<(String, i64), KaiValueError> {
        // value = (int_part frac_part as an integer) × 10^(exponent − len(frac_part))
        let frac_len =
            i64::try_from(self.frac_part.len()).map_err(|_| KaiValueError::FractionOutOfRange)?;
        let mut exponent = self.exponent - frac_len;
        let all = || self.int_part.bytes().chain(self.frac_part.bytes());
        let all_len = self.int_part.len() + self.frac_part.len();
        let lead = all().take_while(|&d| d == b'0').count();
        if lead == all_len {
            return Err(KaiValueError::FractionOutOfRange);
        }
        let mut significant = String::with_capacity(all_len - lead);
        for d in all().skip(lead) {
            significant.push(char::from(d));
        }
        let without_trailing = significant.trim_end_matches('0').len();
        let trailing_zeros = significant.len() - without_trailing;
        significant.truncate(without_trailing);
        exponent += i64::try_from(trailing_zeros).map_err(|_| KaiValueError::FractionOutOfRange)?;
        Ok((significant, exponent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fraction_table() {
        // (text, basis, expected floor)
        let cases: &[(&str, u64, u64)] = &[
            ("0.25", 16384, 4096),
            ("0.5", 81920, 40960),
            (".5", 15360, 7680),
            ("0.50", 15360, 7680),
            ("00.5", 100, 50),
            ("5e-1", 100, 50),
            ("5E-1", 100, 50),
            ("50e-2", 100, 50),
            ("0.05e1", 100, 50),
            ("0.1", 16384, 1638),
            ("0.3", 10, 3),
            // Binary floating point gets these wrong: 0.29*100 = 28.999999999999996,
            // 0.57*100 = 56.99999999999999, 0.58*100 = 57.99999999999999.
            ("0.29", 100, 29),
            ("0.57", 100, 57),
            ("0.58", 100, 58),
            ("0.07", 100, 7),
            ("0.14", 100, 14),
            ("0.7", 10, 7),
            // 0.3 * 81559 = 24467.7 exactly; f64 also fine, but check flooring.
            ("0.3", 81559, 24467),
            ("0.99999999999999994", 81920, 81919),
            ("0.000001", 81920, 0),
            ("1e-30", u64::MAX, 0),
            ("0.9999999999999999", u64::MAX, 18_446_744_073_709_549_770),
            // The forms the tester found refused or mis-scaled, all read by KAI as these values.
            ("0.5e0", 100, 50),
            ("0.25e0", 100, 25),
            (".5e0", 100, 50),
            ("0.5E0", 100, 50),
            ("0.5e00", 100, 50),
            (".06196660E000", 100_000_000, 6_196_660),
            ("00.086254737761e0", 1_000_000_000_000, 86_254_737_761),
            ("0.5e-0", 100, 50),
            ("000.00024E-00", 100_000, 24),
            ("0.5e+0", 100, 50),
            ("+0.5", 100, 50),
            ("+.5", 100, 50),
            ("5.e-1", 100, 50),
            ("5.E-0001", 100, 50),
            ("0.0005e+003", 100, 50),
            // The exponent as Go reads it: accumulation stops at 10000 or more.
            ("5e-0000000000000000000000001", 100, 50),
            // Just below the midpoint under 1: f64 reads it as 1 − 2⁻⁵³, KAI accepts it.
            (
                "0.99999999999999994448884876874217297881841659545898437",
                100,
                99,
            ),
            // Just above 2⁻¹⁰⁷⁵: f64 reads it as the smallest subnormal, KAI accepts it.
            ("3e-324", u64::MAX, 0),
        ];
        for &(text, basis, expected) in cases {
            let f = Fraction::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(f.of(basis), expected, "{text} x {basis}");
        }
    }

    #[test]
    fn float_would_be_wrong_on_these() {
        // Sanity: the cases above really are ones where f64 floors differently.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let float = |f: f64, b: f64| (f * b).floor() as u64;
        assert_eq!(float(0.29, 100.0), 28);
        assert_eq!(float(0.57, 100.0), 56);
        assert_eq!(Fraction::parse("0.29").unwrap().of(100), 29);
        assert_eq!(Fraction::parse("0.57").unwrap().of(100), 57);
    }

    #[test]
    fn fraction_refusals() {
        use KaiValueError::{
            Empty, FractionNotDecimal as Bad, FractionOutOfRange as Range,
            FractionRoundsToBound as Round,
        };
        let cases: &[(&str, KaiValueError)] = &[
            ("", Empty),
            ("0", Range),
            ("0.0", Range),
            ("000", Range),
            ("1", Range),
            ("1.0", Range),
            ("1.5", Range),
            ("10e-1", Range),
            ("0.1e1", Range),
            ("1e99999999999999999999999", Range),
            ("-0.5", Range),
            ("-0", Range),
            ("-.0e-5", Range),
            ("+", Bad),
            ("-", Bad),
            ("+-0.5", Bad),
            ("0.5e", Bad),
            ("0.5e+-1", Bad),
            ("0.5e1.0", Bad),
            ("1_0e-1", Bad),
            ("0.5_0", Bad),
            ("0.5e0_0", Bad),
            ("0x.8p0", Bad),
            ("0X1P-1", Bad),
            ("0.5\n", Bad),
            ("0.5m", Bad),
            ("0.5k", Bad),
            ("5e-1Mi", Bad),
            ("inf", Bad),
            ("-Infinity", Bad),
            // f64 rounds these to 1 or 0, which KAI then refuses.
            (
                "0.999999999999999944488848768742172978818416595458984375",
                Round,
            ),
            ("0.99999999999999999", Round),
            ("0.9999999999999999999999999", Round),
            ("1e-99999999999999999999999", Round),
            ("1e-324", Round),
            ("2e-324", Round),
            (" 0.5", Bad),
            ("0.5 ", Bad),
            ("NaN", Bad),
            ("nan", Bad),
            ("Inf", Bad),
            ("+Inf", Bad),
            ("infinity", Bad),
            ("0x0.8p0", Bad),
            ("0x1p-1", Bad),
            ("250m", Bad),
            ("0.5Gi", Bad),
            (".", Bad),
            ("e-1", Bad),
            ("5e", Bad),
            ("5e+", Bad),
            ("0.5.1", Bad),
            ("0,5", Bad),
            ("½", Bad),
            ("0_5", Bad),
        ];
        for (text, expected) in cases {
            assert_eq!(
                Fraction::parse(text).as_ref().err(),
                Some(expected),
                "{text:?}"
            );
        }
    }

    #[test]
    fn half_min_subnormal_is_five_to_the_1075() {
        let digits = half_min_subnormal();
        assert_eq!(digits.len(), 752);
        assert!(digits.starts_with(b"24703282292062327208828439643411068618252990130716"));
        assert!(digits.ends_with(b"5"));
    }

    #[test]
    fn fraction_displays_normalised() {
        assert_eq!(Fraction::parse("00.2500").unwrap().to_string(), "0.25");
        assert_eq!(Fraction::parse("5e-3").unwrap().to_string(), "0.005");
    }

    #[test]
    fn canonical_form_is_what_the_preload_library_reads() {
        for (text, canonical) in [
            ("0.25", Some("0.25")),
            ("00.2500", Some("0.25")),
            (".5", Some("0.5")),
            ("5e-1", Some("0.5")),
            ("+0.5E0", Some("0.5")),
            ("000.00024E-00", Some("0.00024")),
            (
                "1e-64",
                Some("0.0000000000000000000000000000000000000000000000000000000000000001"),
            ),
            // 65 places: valid for KAI, past what the file holds (the admission cap stands alone).
            ("1e-65", None),
            (
                "0.10000000000000000000000000000000000000000000000000000000000000001",
                None,
            ),
        ] {
            let f = Fraction::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(f.canonical().as_deref(), canonical, "{text}");
            if let Some(c) = f.canonical() {
                // The preload library's reading of the canonical text gives the webhook's cap.
                let digits = hami_preload_core::fraction::parse_canonical(c.as_bytes()).unwrap();
                for mib in [1, 100, 15_360, 81_559, 143_771, u64::MAX] {
                    assert_eq!(
                        hami_preload_core::fraction::of_mib(digits, mib),
                        f.of(mib),
                        "{text} x {mib}"
                    );
                }
            }
        }
    }

    #[test]
    fn memory_table() {
        assert_eq!(parse_gpu_memory("4000"), Ok(4000));
        // The seed fork's bug: "04000" became "04000m", which HAMi-core reads as octal 2048 MiB.
        assert_eq!(parse_gpu_memory("04000"), Ok(4000));
        assert_eq!(parse_gpu_memory("1"), Ok(1));
        assert_eq!(
            parse_gpu_memory(&MAX_MEMORY_MIB.to_string()),
            Ok(MAX_MEMORY_MIB)
        );
        let bad: &[(&str, KaiValueError)] = &[
            ("", KaiValueError::Empty),
            ("0", KaiValueError::MemoryZero),
            ("0000", KaiValueError::MemoryZero),
            ("-1", KaiValueError::MemoryNotInteger),
            ("+1", KaiValueError::MemoryNotInteger),
            ("4000m", KaiValueError::MemoryNotInteger),
            ("4Gi", KaiValueError::MemoryNotInteger),
            ("0x10", KaiValueError::MemoryNotInteger),
            ("1.5", KaiValueError::MemoryNotInteger),
            (" 4000", KaiValueError::MemoryNotInteger),
            ("4e3", KaiValueError::MemoryNotInteger),
            (
                "99999999999999999999999",
                KaiValueError::MemoryTooLarge {
                    max: MAX_MEMORY_MIB,
                },
            ),
            (
                &(MAX_MEMORY_MIB + 1).to_string(),
                KaiValueError::MemoryTooLarge {
                    max: MAX_MEMORY_MIB,
                },
            ),
        ];
        for (text, expected) in bad {
            assert_eq!(
                parse_gpu_memory(text).as_ref().err(),
                Some(expected),
                "{text:?}"
            );
        }
    }
}
