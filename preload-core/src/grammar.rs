//! HAMi-core's value grammar: C's `strtoul(s, &end, 0)` and `get_limit_from_env`'s last-character
//! suffix. The one implementation: `hami_shared::hami_core` re-exports it (and builds its warnings
//! on it); the preload library decides with it.

/// The result of C's `strtoul(s, &end, 0)` as glibc computes it on a 64-bit `unsigned long`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strtoul {
    /// The value returned (`ULONG_MAX` on overflow; negated modulo 2^64 after a `-`).
    pub value: u64,
    /// Byte offset where parsing stopped (`0` when no digits were found, as C sets `end = s`).
    pub end: usize,
    /// The radix chosen by base 0: 8, 10 or 16.
    pub radix: u32,
    /// Number of digits consumed (not counting a `0x` prefix).
    pub digits: usize,
    /// A `-` sign was present.
    pub negative: bool,
    /// The magnitude exceeded `ULONG_MAX` (C sets `ERANGE`).
    pub overflow: bool,
    /// Leading white space was skipped.
    pub leading_space: bool,
}

/// C's `isspace` in the "C" locale: what `strtoul` skips before the number.
pub fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

/// C's `strtoul(s, &end, 0)` (glibc semantics, 64-bit `unsigned long`).
pub fn strtoul(s: &[u8]) -> Strtoul {
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let leading_space = i > 0;
    let mut negative = false;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        negative = s[i] == b'-';
        i += 1;
    }
    let radix;
    if s.get(i) == Some(&b'0')
        && matches!(s.get(i + 1), Some(b'x' | b'X'))
        && s.get(i + 2).is_some_and(|b| b.is_ascii_hexdigit())
    {
        radix = 16;
        i += 2;
    } else if s.get(i) == Some(&b'0') {
        radix = 8;
    } else {
        radix = 10;
    }
    let mut value: u64 = 0;
    let mut overflow = false;
    let mut digits = 0;
    while let Some(d) = s.get(i).and_then(|b| (*b as char).to_digit(radix)) {
        match value
            .checked_mul(u64::from(radix))
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        digits += 1;
        i += 1;
    }
    if digits == 0 {
        return Strtoul {
            value: 0,
            end: 0,
            radix,
            digits,
            negative,
            overflow: false,
            leading_space,
        };
    }
    let value = if overflow {
        u64::MAX
    } else if negative {
        value.wrapping_neg()
    } else {
        value
    };
    Strtoul {
        value,
        end: i,
        radix,
        digits,
        negative,
        overflow,
        leading_space,
    }
}

/// What HAMi-core's `get_limit_from_env` returns for a value: the parsed number, the suffix
/// multiplier, and the product (0 = no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitValue {
    /// `strtoul` of the whole text.
    pub number: Strtoul,
    /// 1, 1024, 1024² or 1024³ from the last character.
    pub scale: u64,
    /// The product, or 0 when it is zero or overflows (HAMi-core then returns 0: no limit).
    pub result: u64,
}

/// HAMi-core's `get_limit_from_env` on `text`.
pub fn read_limit(text: &str) -> LimitValue {
    read_limit_bytes(text.as_bytes())
}

/// [`read_limit`] over bytes.
pub fn read_limit_bytes(bytes: &[u8]) -> LimitValue {
    let scale = match bytes.last() {
        Some(b'k' | b'K') => 1 << 10,
        Some(b'm' | b'M') => 1 << 20,
        Some(b'g' | b'G') => 1 << 30,
        _ => 1,
    };
    let number = strtoul(bytes);
    let result = number.value.checked_mul(scale).unwrap_or(0);
    LimitValue {
        number,
        scale,
        result,
    }
}
