//! The tolerant limits-file reader (what the preload library and `hami-limits check` read):
//! never a panic; the streaming parser agrees with the whole-buffer one; every kept entry has a
//! valid key and a value without newline, CR or NUL; diagnostics name lines that exist.
#![no_main]

use hami_shared::limits_file::{LineParser, MAX_LINE_BYTES, is_valid_key, parse_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = parse_bytes(data);
    let lines = data.split(|b| *b == b'\n').count();
    for d in &parsed.diagnostics {
        assert!(d.line >= 1 && d.line <= lines.max(1), "{d:?}");
    }
    for (k, v) in &parsed.entries {
        assert!(is_valid_key(k), "{k:?}");
        assert!(!v.contains(['\n', '\r', '\0']), "{k}={v:?}");
        assert!(k.len() + v.len() + 2 <= MAX_LINE_BYTES, "{k}");
    }
    // Line by line, as a streaming reader feeds it.
    let mut diagnostics = Vec::new();
    let mut p = LineParser::new();
    if !data.is_empty() {
        let body = data.strip_suffix(b"\n");
        for raw in body.unwrap_or(data).split(|b| *b == b'\n') {
            p.line(raw, raw.len() + 1, &mut |d| diagnostics.push(d));
        }
        p.finish(body.is_some(), &mut |d| diagnostics.push(d));
    } else {
        p.finish(true, &mut |d| diagnostics.push(d));
    }
    let (format, entries) = p.into_parts();
    assert_eq!(diagnostics, parsed.diagnostics);
    assert_eq!(entries, parsed.entries);
    assert_eq!(format, parsed.format);
});
