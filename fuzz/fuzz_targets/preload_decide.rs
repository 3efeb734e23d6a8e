//! The preload library's decision over `/overrideEnv` and the inherited variable names: never a
//! panic; when it applies, it holds a memory limit HAMi-core reads as a limit, exports only
//! contract keys with values free of newline, CR and NUL, and removes only contract variables;
//! a truncated read never exports the cut last line.
#![no_main]

use hami_preload_reference::{Decision, decide};
use hami_shared::hami_core::{KeyKind, interpret_memory, key_kind};
use hami_shared::preload::{is_contract_variable, is_exported_key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (truncated, rest) = match data.split_first() {
        Some((flag, rest)) => (flag & 1 == 1, rest),
        None => (false, data),
    };
    // Inherited names: the part after a 0xff byte, one name per 0xfe-separated piece.
    let (file, env) = match rest.iter().position(|b| *b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let names: Vec<std::ffi::OsString> = env
        .split(|b| *b == 0xfe)
        .map(|n| <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n).to_owned())
        .collect();
    match decide(file, truncated, &names) {
        Decision::Untouched(_) => {}
        Decision::Apply(o) => {
            let mut memory = false;
            for (k, v) in &o.set {
                assert!(is_exported_key(k), "{k}");
                assert!(!v.contains(['\n', '\r', '\0']), "{k}={v:?}");
                if let KeyKind::Memory(_) = key_kind(k) {
                    assert!(interpret_memory(v).reading.bytes().is_some(), "{k}={v:?}");
                    memory = true;
                }
                if truncated {
                    // The value comes from a complete line: `K=V\n` or `K=V\r\n` in the bytes
                    // up to the last newline of the read.
                    let cut = match file.iter().rposition(|b| *b == b'\n') {
                        Some(end) => &file[..=end],
                        None => &[][..],
                    };
                    let lf = format!("{k}={v}\n");
                    let crlf = format!("{k}={v}\r\n");
                    let found = |l: &str| cut.windows(l.len()).any(|w| w == l.as_bytes());
                    assert!(
                        found(&lf) || found(&crlf),
                        "{k}={v:?} not from a complete line"
                    );
                }
            }
            assert!(memory);
            for n in &o.remove {
                assert!(is_contract_variable(
                    std::os::unix::ffi::OsStrExt::as_bytes(n.as_os_str())
                ));
            }
        }
    }
});
