//! KAI's `gpu-memory` and `gpu-fraction` values, parsed strictly and turned into MiB with exact
//! decimal arithmetic.
//!
//! Why not `f64`: `0.1 × 16384` in binary floating point is `1638.4000000000001`, harmless, but
//! `0.7 × 10` is `7.000000000000001` while `0.29 × 100` is `28.999999999999996`, which floors to
//! 28 instead of 29. A cap must be exactly the requested share, so the fraction is kept as its
//! decimal digits and multiplied as an integer.
//!
//! Why not string concatenation: HAMi-core reads memory values with `strtoul(s, _, 0)`, so the seed
//! fork's `04000` + `m` meant octal 2048 MiB. Every value here is re-formatted from the number.

use std::fmt;

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
    /// `gpu-fraction` is not a plain decimal number (NaN, Inf, hex, sign, space, unit ...).
    #[error("is not a decimal number (e.g. \"0.25\"; no sign, unit, space, hex, NaN or Inf)")]
    FractionNotDecimal,
    /// `gpu-fraction` is a decimal number outside (0, 1).
    #[error("is not strictly between 0 and 1")]
    FractionOutOfRange,
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

/// The most digits an exponent may have before the value is obviously out of range.
const MAX_EXPONENT_DIGITS: usize = 18;

impl Fraction {
    /// Parse a `gpu-fraction` value: a decimal number (`0.25`, `.5`, `5e-1`, `00.50`), which is
    /// what both KAI's `strconv.ParseFloat` and `resource.ParseQuantity` accept, strictly between
    /// 0 and 1.
    ///
    /// # Errors
    /// [`KaiValueError`] naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, KaiValueError> {
        if text.is_empty() {
            return Err(KaiValueError::Empty);
        }
        let (mantissa, exp_text) = match text.find(['e', 'E']) {
            Some(i) => (&text[..i], Some(&text[i + 1..])),
            None => (text, None),
        };
        let (int_part, frac_part) = match mantissa.split_once('.') {
            Some((i, f)) => (i, f),
            None => (mantissa, ""),
        };
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (int_part.is_empty() && frac_part.is_empty())
            || !all_digits(int_part)
            || !all_digits(frac_part)
        {
            return Err(KaiValueError::FractionNotDecimal);
        }
        let mut exponent: i64 = match exp_text {
            None => 0,
            Some(e) => {
                let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
                if digits.is_empty() || !all_digits(digits) {
                    return Err(KaiValueError::FractionNotDecimal);
                }
                let significant = digits.trim_start_matches('0');
                let magnitude: i64 = if significant.len() > MAX_EXPONENT_DIGITS {
                    // 10^(±10^18) and beyond: far above 1, or a share that floors to 0 MiB.
                    i64::MAX / 4
                } else {
                    significant.parse().unwrap_or(i64::MAX / 4)
                };
                if e.starts_with('-') {
                    -magnitude
                } else {
                    magnitude
                }
            }
        };
        // value = (int_part frac_part as an integer) × 10^(exponent − len(frac_part))
        let frac_len =
            i64::try_from(frac_part.len()).map_err(|_| KaiValueError::FractionOutOfRange)?;
        exponent = exponent.saturating_sub(frac_len);
        let mut all = String::with_capacity(int_part.len() + frac_part.len());
        all.push_str(int_part);
        all.push_str(frac_part);
        let trimmed_leading = all.trim_start_matches('0');
        let significant = trimmed_leading.trim_end_matches('0');
        let trailing_zeros = trimmed_leading.len() - significant.len();
        if significant.is_empty() {
            return Err(KaiValueError::FractionOutOfRange);
        }
        exponent = exponent.saturating_add(i64::try_from(trailing_zeros).unwrap_or(i64::MAX));
        // digits × 10^exponent < 1  ⟺  len(digits) + exponent ≤ 0 (digits has no leading zero).
        let len = i64::try_from(significant.len()).unwrap_or(i64::MAX);
        if len.saturating_add(exponent) > 0 {
            return Err(KaiValueError::FractionOutOfRange);
        }
        Ok(Self {
            digits: significant.into(),
            exponent,
        })
    }

    /// `floor(self × mib)`, exactly.
    #[must_use]
    pub fn of(&self, mib: u64) -> u64 {
        // self < 1, so the result is < mib; a value below 10^-20 times any u64 floors to 0.
        let places = self.exponent.unsigned_abs();
        let len = self.digits.len() as u64;
        if places >= len + 20 {
            return 0;
        }
        // product = digits × mib as decimal digits (most significant first), then drop the last
        // `places` digits.
        let mut product: Vec<u8> = Vec::with_capacity(self.digits.len() + 20);
        let mut carry: u128 = 0;
        for d in self.digits.bytes().rev() {
            let v = u128::from(d - b'0') * u128::from(mib) + carry;
            product.push((v % 10) as u8);
            carry = v / 10;
        }
        while carry > 0 {
            product.push((carry % 10) as u8);
            carry /= 10;
        }
        // `product` is least significant first; skip `places` digits.
        let skip = usize::try_from(places).unwrap_or(usize::MAX);
        let mut result: u64 = 0;
        for &d in product.iter().skip(skip).rev() {
            result = result.saturating_mul(10).saturating_add(u64::from(d));
        }
        result
    }
}

impl fmt::Display for Fraction {
    /// The value in plain decimal notation, e.g. `0.25`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let places = usize::try_from(self.exponent.unsigned_abs()).unwrap_or(usize::MAX);
        if places > 64 {
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
            ("0.999999999999999999999999999999", 81920, 81919),
            ("0.000001", 81920, 0),
            ("1e-30", u64::MAX, 0),
            ("1e-99999999999999999999999", u64::MAX, 0),
            ("0.9999999999999999999999999", u64::MAX, u64::MAX - 1),
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
        use KaiValueError::{Empty, FractionNotDecimal as Bad, FractionOutOfRange as Range};
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
            ("-0.5", Bad),
            ("+0.5", Bad),
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
    fn fraction_displays_normalised() {
        assert_eq!(Fraction::parse("00.2500").unwrap().to_string(), "0.25");
        assert_eq!(Fraction::parse("5e-3").unwrap().to_string(), "0.005");
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
