//! What HAMi-core will really read: its value grammar, reproduced so that we can warn whenever a
//! value means something other than it evidently intends.
//!
//! HAMi-core (`get_limit_from_env`) reads memory and SM values with `strtoul(s, &end, 0)`:
//! base 0, so a leading `0` is octal and `0x` is hexadecimal; text after the number is ignored;
//! only the **last character** is checked for a `k/K`, `m/M`, `g/G` suffix (powers of 1024), and
//! anything else means bytes. A zero result, an unparsable value and an overflowing product all
//! mean **no limit**. So `04000m` is 2048 MiB, `3000Mi` is 3000 bytes, `4Gi` is 4 bytes, `-1` and
//! `0` are no limit, and `3000m\r` (a CRLF file) is 3000 bytes.

use std::fmt;
use std::num::NonZeroU64;

use crate::names::{
    ENV_CUDA_DEVICE_MEMORY_LIMIT, ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE, ENV_CUDA_DEVICE_SM_LIMIT,
    ENV_CUDA_TASK_PRIORITY, ENV_GPU_CORE_UTILIZATION_POLICY, ENV_LIBCUDA_LOG_LEVEL,
    ENV_LIBVGPU_HOSTPID_BROKER, MAX_DEVICE_INDEX,
};

pub use hami_preload_core::grammar::{LimitValue, Strtoul, is_c_space, read_limit, strtoul};

/// The memory limit HAMi-core enforces for a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryReading {
    /// No limit: zero, unparsable, negative (wraps to ~2^64 bytes) or overflowing.
    Unlimited,
    /// A limit of this many bytes.
    Bytes(NonZeroU64),
}

impl MemoryReading {
    /// The limit in bytes, if any.
    pub fn bytes(self) -> Option<u64> {
        match self {
            MemoryReading::Unlimited => None,
            MemoryReading::Bytes(b) => Some(b.get()),
        }
    }
}

impl fmt::Display for MemoryReading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryReading::Unlimited => f.write_str("no limit"),
            MemoryReading::Bytes(b) if b.get() % (1 << 20) == 0 => {
                write!(f, "{} MiB", b.get() >> 20)
            }
            MemoryReading::Bytes(b) if b.get() == 1 => f.write_str("1 byte"),
            MemoryReading::Bytes(b) => write!(f, "{} bytes", b.get()),
        }
    }
}

/// A memory value as HAMi-core reads it, with the ways that differs from the evident intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryInterpretation {
    /// What HAMi-core enforces.
    pub reading: MemoryReading,
    /// One message per surprise; empty for the safe form `^[1-9][0-9]*m$`.
    pub warnings: Vec<String>,
}

/// The core limit HAMi-core applies for a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmInterpretation {
    /// The number `get_limit_from_env` returns (0 = unset/invalid).
    pub read: u64,
    /// The percentage in effect: 0 and anything at or above 100 mean 100 (no throttling).
    pub percent: u8,
    /// True when HAMi-core throttles (1..=99).
    pub throttled: bool,
    /// One message per surprise; empty for a bare decimal integer 0..=100.
    pub warnings: Vec<String>,
}

/// Warnings about the number's spelling shared by memory and SM values.
fn number_warnings(text: &str, lv: &LimitValue, reads: &str, warnings: &mut Vec<String>) {
    let n = &lv.number;
    if n.leading_space {
        warnings.push(format!(
            "leading white space (strtoul skips it): HAMi-core reads {reads}"
        ));
    }
    if n.digits == 0 {
        return;
    }
    if n.negative {
        warnings.push(format!(
            "negative value wraps around (strtoul): HAMi-core reads {reads}"
        ));
    }
    let spelled =
        text[..n.end].trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '+' || c == '-');
    if n.radix == 16 {
        warnings.push(format!(
            "0x prefix: {} is hexadecimal (= {}): HAMi-core reads {reads}",
            spelled, n.value
        ));
    } else if n.radix == 8
        && (n.digits > 1 || text.as_bytes().get(n.end).is_some_and(u8::is_ascii_digit))
    {
        warnings.push(format!(
            "leading zero: {spelled} is octal (= {}): HAMi-core reads {reads}",
            n.value
        ));
    }
    if n.overflow {
        warnings.push(format!(
            "number too large for 64 bits: HAMi-core reads {reads}"
        ));
    }
}

/// Describe the text after the number, given that the last character may be a suffix.
fn trailing_warnings(
    text: &str,
    lv: &LimitValue,
    reads: &str,
    unit_hint: &str,
    warnings: &mut Vec<String>,
) {
    let n = &lv.number;
    if n.digits == 0 {
        return;
    }
    let rest = &text[n.end..];
    let suffix_len = usize::from(lv.scale != 1);
    let junk = &rest[..rest.len().saturating_sub(suffix_len)];
    if junk.is_empty() {
        return;
    }
    let is_unit_spelling = rest.len() >= 2
        && rest.bytes().all(|b| b.is_ascii_alphabetic())
        && matches!(
            rest.as_bytes()[0],
            b'k' | b'K' | b'm' | b'M' | b'g' | b'G' | b't' | b'T' | b'b' | b'B'
        );
    if junk.starts_with(['.', ',']) && junk[1..].starts_with(|c: char| c.is_ascii_digit()) {
        warnings.push(format!(
            "fraction {junk:?} is ignored (strtoul stops at {:?}): HAMi-core reads {reads}",
            &junk[..1]
        ));
    } else if is_unit_spelling || rest == "b" || rest == "B" || rest.eq_ignore_ascii_case("t") {
        warnings.push(format!(
            "unit {rest:?} is not understood (only the last character counts; {unit_hint}): HAMi-core reads {reads}"
        ));
    } else if junk.bytes().all(is_c_space) {
        warnings.push(format!(
            "trailing white space {junk:?}: HAMi-core reads {reads}"
        ));
    } else {
        warnings.push(format!(
            "trailing text {junk:?} is ignored: HAMi-core reads {reads}"
        ));
    }
}

/// Interpret a memory value (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_MEMORY_LIMIT_<i>`) as
/// HAMi-core does, with a warning wherever the result differs from the evident intent.
pub fn interpret_memory(text: &str) -> MemoryInterpretation {
    let lv = read_limit(text);
    // A negative number wraps to ~2^64 bytes: a "limit" that never binds.
    let reading = match NonZeroU64::new(lv.result) {
        Some(b) if !lv.number.negative => MemoryReading::Bytes(b),
        _ => MemoryReading::Unlimited,
    };
    let reads = reading.to_string();
    let mut warnings = Vec::new();
    if text.is_empty() {
        warnings.push("empty value: HAMi-core reads no limit".to_owned());
        return MemoryInterpretation { reading, warnings };
    }
    if text.contains('\r') {
        warnings.push(format!(
            "carriage return in the value (CRLF file?): HAMi-core reads {reads}"
        ));
    }
    number_warnings(text, &lv, &reads, &mut warnings);
    let n = &lv.number;
    if n.digits == 0 {
        warnings.push(format!(
            "{text:?} is not a number: HAMi-core reads no limit"
        ));
        return MemoryInterpretation { reading, warnings };
    }
    trailing_warnings(text, &lv, &reads, "write <n>m for MiB", &mut warnings);
    if n.value == 0 {
        warnings.push("zero means no limit to HAMi-core".to_owned());
    } else if !n.overflow && !n.negative && lv.result == 0 {
        warnings.push("the byte count overflows 64 bits: HAMi-core reads no limit".to_owned());
    }
    if lv.scale == 1 && n.end == text.len() && n.value != 0 && !n.negative {
        warnings.push(format!(
            "no unit suffix: HAMi-core reads {reads}; write {}m for MiB",
            n.value
        ));
    }
    MemoryInterpretation { reading, warnings }
}

/// Interpret a core limit (`CUDA_DEVICE_SM_LIMIT`, `_<i>`) as HAMi-core does. `0` is HAMi's
/// spelling of "no core limit" and is not warned about; a bare integer 1..=100 is the safe form.
pub fn interpret_sm(text: &str) -> SmInterpretation {
    let lv = read_limit(text);
    let read = if lv.number.negative {
        u64::MAX
    } else {
        lv.result
    };
    let throttled = (1..100).contains(&read);
    let percent = if throttled { read as u8 } else { 100 };
    let reads = if throttled {
        format!("{percent}%")
    } else {
        "no core limit (100%)".to_owned()
    };
    let mut warnings = Vec::new();
    if text.is_empty() {
        warnings.push("empty value: HAMi-core reads no core limit (100%)".to_owned());
    } else {
        if text.contains('\r') {
            warnings.push(format!(
                "carriage return in the value (CRLF file?): HAMi-core reads {reads}"
            ));
        }
        number_warnings(text, &lv, &reads, &mut warnings);
        if lv.number.digits == 0 {
            warnings.push(format!(
                "{text:?} is not a number: HAMi-core reads no core limit (100%)"
            ));
        } else {
            trailing_warnings(
                text,
                &lv,
                &reads,
                "the limit is a bare percentage",
                &mut warnings,
            );
            if lv.scale != 1 {
                warnings.push(format!(
                    "suffix {:?} multiplies the percentage by {}: HAMi-core reads {reads}",
                    &text[text.len() - 1..],
                    lv.scale
                ));
            }
            if !lv.number.negative && lv.number.value > 100 && lv.scale == 1 {
                warnings.push(format!(
                    "{} is above 100: HAMi-core reads {reads}",
                    lv.number.value
                ));
            }
        }
    }
    SmInterpretation {
        read,
        percent,
        throttled,
        warnings,
    }
}

/// The role a limits-file key plays for HAMi-core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// `CUDA_DEVICE_MEMORY_LIMIT` (`None`) or `CUDA_DEVICE_MEMORY_LIMIT_<i>` for i in 0..=15.
    Memory(Option<usize>),
    /// `CUDA_DEVICE_SM_LIMIT` (`None`) or `CUDA_DEVICE_SM_LIMIT_<i>` for i in 0..=15.
    Sm(Option<usize>),
    /// A per-device memory or SM name HAMi-core never reads (index above 15, or a leading zero).
    UnreadIndex,
    /// `GPU_CORE_UTILIZATION_POLICY`.
    CorePolicy,
    /// `CUDA_TASK_PRIORITY`.
    TaskPriority,
    /// `LIBCUDA_LOG_LEVEL`.
    LogLevel,
    /// `LIBVGPU_HOSTPID_BROKER`.
    HostPidBroker,
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE`.
    SharedCache,
    /// Anything else (kept, not interpreted).
    Other,
}

fn indexed(key: &str, base: &str) -> Option<Result<Option<usize>, ()>> {
    hami_preload_core::keys::indexed(key.as_bytes(), base)
}

/// Classify a key.
pub fn key_kind(key: &str) -> KeyKind {
    if let Some(r) = indexed(key, ENV_CUDA_DEVICE_MEMORY_LIMIT) {
        return r.map_or(KeyKind::UnreadIndex, KeyKind::Memory);
    }
    if let Some(r) = indexed(key, ENV_CUDA_DEVICE_SM_LIMIT) {
        return r.map_or(KeyKind::UnreadIndex, KeyKind::Sm);
    }
    match key {
        ENV_GPU_CORE_UTILIZATION_POLICY => KeyKind::CorePolicy,
        ENV_CUDA_TASK_PRIORITY => KeyKind::TaskPriority,
        ENV_LIBCUDA_LOG_LEVEL => KeyKind::LogLevel,
        ENV_LIBVGPU_HOSTPID_BROKER => KeyKind::HostPidBroker,
        ENV_CUDA_DEVICE_MEMORY_SHARED_CACHE => KeyKind::SharedCache,
        _ => KeyKind::Other,
    }
}

/// Warnings for one `KEY=VALUE` as HAMi-core would read it; empty when the value means what it
/// evidently says (or the key is not one HAMi-core interprets).
pub fn check_entry(key: &str, value: &str) -> Vec<String> {
    match key_kind(key) {
        KeyKind::Memory(_) => interpret_memory(value).warnings,
        KeyKind::Sm(_) => interpret_sm(value).warnings,
        KeyKind::UnreadIndex => vec![format!(
            "HAMi-core never reads this key (device indexes are 0..={MAX_DEVICE_INDEX}, written without leading zero)"
        )],
        KeyKind::CorePolicy => match value {
            "default" | "force" | "FORCE" | "disable" | "DISABLE" => vec![],
            _ => vec![format!(
                "{value:?} is not read by HAMi-core (it knows force/FORCE and disable/DISABLE): treated as default"
            )],
        },
        KeyKind::TaskPriority => {
            let digits = value.strip_prefix('-').unwrap_or(value);
            if !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && value.parse::<i32>().is_ok()
            {
                vec![]
            } else {
                vec![format!(
                    "{value:?} is not a plain integer: HAMi-core reads it with atoi, which gives {}",
                    atoi(value)
                )]
            }
        }
        KeyKind::LogLevel => match value {
            "0" | "1" | "2" | "3" | "4" => vec![],
            _ => vec![format!(
                "{value:?} is not a log level HAMi-core knows (0..4)"
            )],
        },
        KeyKind::HostPidBroker => match value {
            "0" | "1" => vec![],
            _ => vec![format!(
                "{value:?}: HAMi-core enables the host PID broker only for \"1\""
            )],
        },
        KeyKind::SharedCache => {
            if value.starts_with('/') && !value.contains(char::is_whitespace) {
                vec![]
            } else {
                vec![format!(
                    "{value:?} is not an absolute path without spaces: if HAMi-core cannot open it, every CUDA process in the container exits"
                )]
            }
        }
        KeyKind::Other => vec![],
    }
}

/// C's `atoi` (32-bit, wrapping like glibc's `(int) strtol`).
pub fn atoi(text: &str) -> i32 {
    let s = text.as_bytes();
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let mut negative = false;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        negative = s[i] == b'-';
        i += 1;
    }
    let mut v: i64 = 0;
    while let Some(d) = s.get(i).filter(|b| b.is_ascii_digit()) {
        v = v.saturating_mul(10).saturating_add(i64::from(d - b'0'));
        i += 1;
    }
    let v = if negative { -v } else { v };
    v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn mem(text: &str) -> (Option<u64>, usize) {
        let i = interpret_memory(text);
        (i.reading.bytes(), i.warnings.len())
    }

    /// REFERENCE.md's cases and more: (value, bytes HAMi-core enforces or None = no limit,
    /// a word the warning must contain or "" for none).
    #[test]
    fn memory_interpretation_table() {
        let table: &[(&str, Option<u64>, &str)] = &[
            ("3000m", Some(3000 * MIB), ""),
            ("3000M", Some(3000 * MIB), ""),
            ("1g", Some(1024 * MIB), ""),
            ("4G", Some(4096 * MIB), ""),
            ("512k", Some(512 * 1024), ""),
            ("04000m", Some(2048 * MIB), "octal"),
            ("010", Some(8), "octal"),
            ("0900m", None, "octal"),
            ("3000Mi", Some(3000), "unit \"Mi\""),
            ("4Gi", Some(4), "unit \"Gi\""),
            ("3000MB", Some(3000), "unit"),
            ("4GiB", Some(4), "unit"),
            ("3000MiB", Some(3000), "unit"),
            ("-1", None, "negative"),
            ("-1m", None, "negative"),
            ("0", None, "zero"),
            ("0m", None, "zero"),
            ("0x10m", Some(16 * MIB), "hexadecimal"),
            ("0X1g", Some(1024 * MIB), "hexadecimal"),
            ("3000m\r", Some(3000), "carriage return"),
            ("1.5g", Some(1024 * MIB), "fraction"),
            ("2.5", Some(2), "fraction"),
            ("3000", Some(3000), "no unit suffix"),
            ("3000 m", Some(3000 * MIB), "trailing white space"),
            ("3000xm", Some(3000 * MIB), "trailing text"),
            (" 3000m", Some(3000 * MIB), "leading white space"),
            ("abc", None, "not a number"),
            ("m", None, "not a number"),
            ("", None, "empty"),
            ("99999999999999999999m", None, "too large"),
            ("17592186044416m", None, "overflows"),
            ("17592186044415m", Some(17592186044415 * MIB), ""),
            ("+5m", Some(5 * MIB), ""),
        ];
        for (text, bytes, word) in table {
            let got = interpret_memory(text);
            assert_eq!(got.reading.bytes(), *bytes, "{text:?}: {got:?}");
            if word.is_empty() {
                assert!(got.warnings.is_empty(), "{text:?}: {got:?}");
            } else {
                assert!(
                    got.warnings.iter().any(|w| w.contains(word)),
                    "{text:?} should warn about {word}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn warnings_say_what_hami_core_reads() {
        let w = interpret_memory("04000m").warnings.join("|");
        assert!(w.contains("HAMi-core reads 2048 MiB"), "{w}");
        let w = interpret_memory("3000Mi").warnings.join("|");
        assert!(w.contains("HAMi-core reads 3000 bytes"), "{w}");
        let w = interpret_memory("-1").warnings.join("|");
        assert!(w.contains("HAMi-core reads no limit"), "{w}");
        assert_eq!(mem("1"), (Some(1), 1));
    }

    #[test]
    fn strtoul_matches_c() {
        let cases: &[(&str, u64, usize)] = &[
            ("42", 42, 2),
            ("0", 0, 1),
            ("0x", 0, 1),
            ("0x1f", 31, 4),
            ("017", 15, 3),
            ("09", 0, 1),
            ("-1", u64::MAX, 2),
            ("  7z", 7, 3),
            ("z", 0, 0),
            ("-", 0, 0),
            ("18446744073709551616", u64::MAX, 20),
        ];
        for (s, v, end) in cases {
            let r = strtoul(s.as_bytes());
            assert_eq!((r.value, r.end), (*v, *end), "{s:?}");
        }
    }

    #[test]
    fn sm_interpretation_table() {
        let table: &[(&str, u8, bool, &str)] = &[
            ("50", 50, true, ""),
            ("100", 100, false, ""),
            ("0", 100, false, ""),
            ("1", 1, true, ""),
            ("050", 40, true, "octal"),
            ("0x20", 32, true, "hexadecimal"),
            ("150", 100, false, "above 100"),
            ("50m", 100, false, "multiplies"),
            ("50%", 50, true, "trailing text"),
            ("-1", 100, false, "negative"),
            ("abc", 100, false, "not a number"),
            ("", 100, false, "empty"),
            ("50\r", 50, true, "carriage return"),
        ];
        for (text, percent, throttled, word) in table {
            let got = interpret_sm(text);
            assert_eq!(
                (got.percent, got.throttled),
                (*percent, *throttled),
                "{text:?}: {got:?}"
            );
            if word.is_empty() {
                assert!(got.warnings.is_empty(), "{text:?}: {got:?}");
            } else {
                assert!(
                    got.warnings.iter().any(|w| w.contains(word)),
                    "{text:?}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn other_keys() {
        assert!(check_entry("GPU_CORE_UTILIZATION_POLICY", "force").is_empty());
        assert_eq!(check_entry("GPU_CORE_UTILIZATION_POLICY", "Force").len(), 1);
        assert!(check_entry("CUDA_TASK_PRIORITY", "-1").is_empty());
        assert!(check_entry("CUDA_TASK_PRIORITY", "1x")[0].contains("gives 1"));
        assert_eq!(check_entry("CUDA_DEVICE_MEMORY_LIMIT_16", "1m").len(), 1);
        assert_eq!(check_entry("CUDA_DEVICE_MEMORY_LIMIT_01", "1m").len(), 1);
        assert!(check_entry("CUDA_DEVICE_MEMORY_LIMIT_15", "1m").is_empty());
        assert!(
            check_entry(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                "/usr/local/vgpu/usage.cache"
            )
            .is_empty()
        );
        assert_eq!(
            check_entry("CUDA_DEVICE_MEMORY_SHARED_CACHE", "usage.cache").len(),
            1
        );
        assert!(check_entry("LIBVGPU_HOSTPID_BROKER", "true")[0].contains("\"1\""));
        assert!(check_entry("SOMETHING_ELSE", "04000m").is_empty());
        assert_eq!(key_kind("CUDA_DEVICE_MEMORY_LIMIT"), KeyKind::Memory(None));
        assert_eq!(key_kind("CUDA_DEVICE_SM_LIMIT_3"), KeyKind::Sm(Some(3)));
        assert_eq!(key_kind("CUDA_DEVICE_MEMORY_LIMITX"), KeyKind::Other);
        assert_eq!(atoi(" -12ab"), -12);
    }
}
