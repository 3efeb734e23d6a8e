//! The limits file: render/parse round trip (property test) and a table of malformed files.

use std::collections::BTreeMap;

use hami_shared::hami_core::{KeyKind, key_kind};
use hami_shared::limits_file::{LimitsFile, Severity, parse, parse_bytes};
use hami_shared::names::memory_limit_env;
use hami_shared::values::{MemoryLimitMib, SmLimit};
use proptest::prelude::*;

fn other_key() -> impl Strategy<Value = String> {
    "[A-Z_][A-Z0-9_]{0,24}".prop_filter("not a key with a strict value grammar", |k| {
        k != "HAMI_LIMITS_FORMAT" && key_kind(k) == KeyKind::Other
    })
}

fn any_value() -> impl Strategy<Value = String> {
    "[^\n\r\u{0}]{0,40}"
}

/// Arbitrary other entries, memory limits per device, and an SM limit.
type Entries = (BTreeMap<String, String>, Vec<(usize, u64)>, Option<u8>);

fn entries() -> impl Strategy<Value = Entries> {
    (
        prop::collection::btree_map(other_key(), any_value(), 0..12),
        prop::collection::vec((0usize..=15, 1u64..=MemoryLimitMib::MAX), 0..4),
        prop::option::of(0u8..=100),
    )
}

fn build(
    others: &BTreeMap<String, String>,
    mems: &[(usize, u64)],
    sm: Option<u8>,
    reverse: bool,
) -> LimitsFile {
    let mut f = LimitsFile::new();
    let mut items: Vec<(&String, &String)> = others.iter().collect();
    if reverse {
        items.reverse();
    }
    for (k, v) in items {
        f.insert(k.clone(), v.clone()).unwrap();
    }
    for (i, mib) in mems {
        f.set_memory_limit(*i, MemoryLimitMib::new(*mib).unwrap())
            .unwrap();
    }
    if let Some(p) = sm {
        f.set_sm_limit(SmLimit::new(u32::from(p)).unwrap());
    }
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever valid entries go in, the rendered file parses back to exactly them, without a
    /// single diagnostic, and the bytes are sorted, newline-terminated and independent of the
    /// insertion order.
    #[test]
    fn render_parse_round_trip((others, mems, sm) in entries()) {
        let file = build(&others, &mems, sm, false);
        let text = file.render();
        let parsed = parse(&text);
        prop_assert_eq!(&parsed.diagnostics, &vec![]);
        prop_assert_eq!(parsed.format, Some(1));
        prop_assert_eq!(&parsed.entries, &file.texts());
        prop_assert!(text.ends_with('\n'));
        prop_assert!(text.lines().any(|l| l == "HAMI_LIMITS_FORMAT=1"));
        let keys: Vec<&str> = text.lines().map(|l| l.split_once('=').unwrap().0).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        prop_assert_eq!(keys, sorted);
        // Byte-stable: insertion order does not matter, and re-rendering the parse is identical.
        prop_assert_eq!(build(&others, &mems, sm, true).render(), text.clone());
        prop_assert_eq!(LimitsFile::from_entries(parsed.entries).unwrap().render(), text);
        let mut want: BTreeMap<usize, u64> = BTreeMap::new();
        for (i, mib) in &mems {
            want.insert(*i, *mib); // a later set_memory_limit for the same device wins
        }
        for (i, mib) in want {
            let rendered = format!("{}m", mib);
            let text = file.text(&memory_limit_env(i));
            prop_assert_eq!(text.as_deref(), Some(rendered.as_str()));
        }
    }

    /// The tolerant reader never panics, and every diagnostic points at a line of the input.
    #[test]
    fn parse_is_total(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let parsed = parse_bytes(&bytes);
        let lines = bytes.split(|b| *b == b'\n').count().max(1);
        for d in &parsed.diagnostics {
            prop_assert!(d.line >= 1 && d.line <= lines, "{:?} in {} lines", d, lines);
        }
    }
}

/// (file, expected diagnostics as (line, severity, words the message contains), expected entries)
type Case = (
    &'static str,
    &'static [(usize, Severity, &'static str)],
    &'static [(&'static str, &'static str)],
);

#[test]
fn malformed_files_report_the_right_lines_and_keep_the_good_ones() {
    use Severity::{Error, Warning};
    let cases: &[Case] = &[
        // A blank line: today's HAMi-core stops here; we report it and read on.
        (
            "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\n\nCUDA_DEVICE_SM_LIMIT=50\nHAMI_LIMITS_FORMAT=1\n",
            &[(2, Error, "blank line")],
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
                ("CUDA_DEVICE_SM_LIMIT", "50"),
                ("HAMI_LIMITS_FORMAT", "1"),
            ],
        ),
        // Comment, no '=', empty key, bad key characters, spaces around '='.
        (
            "# written by hand\nGARBAGE\n=5\nlower=1\nKEY =v\nA-B=1\nGOOD=1\n",
            &[
                (1, Error, "comment line"),
                (2, Error, "has no '='"),
                (3, Error, "empty key"),
                (4, Error, "\"lower\" is not of the form"),
                (5, Error, "white space around the key"),
                (6, Error, "\"A-B\""),
            ],
            &[("GOOD", "1")],
        ),
        // CRLF endings: the CR is stripped (warning); a CR inside a line is an error.
        (
            "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\r\nCUDA_DEVICE_SM_LIMIT=50\nHAMI_LIMITS_FORMAT=1\r\n",
            &[
                (1, Warning, "CRLF line ending"),
                (3, Warning, "CRLF line ending"),
            ],
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
                ("CUDA_DEVICE_SM_LIMIT", "50"),
                ("HAMI_LIMITS_FORMAT", "1"),
            ],
        ),
        (
            "CUDA_DEVICE_MEMORY_LIMIT_0=30\r00m\nCUDA_DEVICE_SM_LIMIT=50\r\r\nHAMI_LIMITS_FORMAT=1\n",
            &[
                (1, Error, "carriage return before its end"),
                (2, Warning, "CRLF line ending"),
                (2, Error, "carriage return before its end"),
            ],
            &[("HAMI_LIMITS_FORMAT", "1")],
        ),
        // A later duplicate wins, with a warning on its line.
        (
            "CUDA_DEVICE_SM_LIMIT=30\nHAMI_LIMITS_FORMAT=1\nCUDA_DEVICE_SM_LIMIT=60\n",
            &[(
                3,
                Warning,
                "duplicate key CUDA_DEVICE_SM_LIMIT (also on line 1)",
            )],
            &[("CUDA_DEVICE_SM_LIMIT", "60"), ("HAMI_LIMITS_FORMAT", "1")],
        ),
        // A legacy file (no format line) is accepted without a diagnostic; unknown keys are kept.
        (
            "CUDA_DEVICE_MEMORY_LIMIT_0=3000m\nSOME_FUTURE_KEY=x=y\n",
            &[],
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
                ("SOME_FUTURE_KEY", "x=y"),
            ],
        ),
        // A newer format is read with a warning; an invalid one is a warning too.
        (
            "HAMI_LIMITS_FORMAT=2\nA=1\n",
            &[(1, Warning, "format 2 is newer")],
            &[("A", "1"), ("HAMI_LIMITS_FORMAT", "2")],
        ),
        (
            "A=1\nHAMI_LIMITS_FORMAT=one\n",
            &[(2, Warning, "not a positive integer")],
            &[("A", "1"), ("HAMI_LIMITS_FORMAT", "one")],
        ),
        // A truncated file: the last line has no newline.
        (
            "HAMI_LIMITS_FORMAT=1\nCUDA_DEVICE_MEMORY_LIMIT_0=30",
            &[
                (2, Warning, "no unit suffix"),
                (2, Warning, "no newline at the end"),
            ],
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "30"),
                ("HAMI_LIMITS_FORMAT", "1"),
            ],
        ),
        // Values HAMi-core misreads: warnings, lines kept.
        (
            "CUDA_DEVICE_MEMORY_LIMIT_0=04000m\nCUDA_DEVICE_MEMORY_LIMIT_1=3000Mi\nCUDA_DEVICE_MEMORY_LIMIT_2=0\nCUDA_DEVICE_SM_LIMIT=050\nHAMI_LIMITS_FORMAT=1\n",
            &[
                (1, Warning, "reads 2048 MiB"),
                (2, Warning, "reads 3000 bytes"),
                (3, Warning, "zero means no limit"),
                (4, Warning, "reads 40%"),
            ],
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "04000m"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "3000Mi"),
                ("CUDA_DEVICE_MEMORY_LIMIT_2", "0"),
                ("CUDA_DEVICE_SM_LIMIT", "050"),
                ("HAMI_LIMITS_FORMAT", "1"),
            ],
        ),
        // The empty file.
        ("", &[(1, Warning, "empty")], &[]),
    ];
    for (text, want_diags, want_entries) in cases {
        let parsed = parse(text);
        let got: Vec<(usize, Severity)> = parsed
            .diagnostics
            .iter()
            .map(|d| (d.line, d.severity))
            .collect();
        let want: Vec<(usize, Severity)> = want_diags.iter().map(|(l, s, _)| (*l, *s)).collect();
        assert_eq!(got, want, "{text:?}: {:#?}", parsed.diagnostics);
        for (d, (_, _, words)) in parsed.diagnostics.iter().zip(want_diags.iter()) {
            assert!(
                d.message.contains(words),
                "{text:?}: {:?} should contain {words:?}",
                d.message
            );
        }
        let want_entries: BTreeMap<String, String> = want_entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(parsed.entries, want_entries, "{text:?}");
    }
}

#[test]
fn line_longer_than_hami_cores_buffer_is_an_error() {
    let long = format!("LONG={}\nA=1\n", "x".repeat(10_000));
    let parsed = parse(&long);
    assert_eq!(parsed.diagnostics.len(), 1);
    assert_eq!(
        (parsed.diagnostics[0].line, parsed.diagnostics[0].severity),
        (1, Severity::Error)
    );
    assert!(parsed.diagnostics[0].message.contains("9999"));
    assert_eq!(parsed.entries.keys().collect::<Vec<_>>(), ["A"]);
}

#[test]
fn non_utf8_and_nul_lines_are_skipped() {
    let parsed = parse_bytes(b"A=\xff\nB=x\x00y\nC=1\n");
    let lines: Vec<_> = parsed
        .diagnostics
        .iter()
        .map(|d| (d.line, d.severity))
        .collect();
    assert_eq!(lines, [(1, Severity::Error), (2, Severity::Error)]);
    assert_eq!(parsed.entries.keys().collect::<Vec<_>>(), ["C"]);
}
