//! The `KEY=VALUE` line grammar of the limits file and the node GPU file, over byte offsets (no
//! allocation). `hami_shared::limits_file::LineParser` is the tolerant parser with diagnostics over
//! the same grammar; a line it reports as an error is [`LineKind::Malformed`] here, every other
//! line is an [`LineKind::Entry`].

/// The longest line HAMi-core reads (its `fgets` buffer less the newline).
pub const MAX_LINE_BYTES: usize = 9_999;

/// True for `[A-Z_][A-Z0-9_]*`.
#[must_use]
pub fn is_valid_key(key: &[u8]) -> bool {
    match key.split_first() {
        Some((first, rest)) => {
            matches!(first, b'A'..=b'Z' | b'_')
                && rest
                    .iter()
                    .all(|b| matches!(b, b'A'..=b'Z' | b'0'..=b'9' | b'_'))
        }
        None => false,
    }
}

/// What one line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// A well-formed entry: the key is `bytes[start..eq]`, the value `bytes[eq + 1..end]`.
    Entry {
        /// Offset of the `=`.
        eq: usize,
    },
    /// Too long, a CR before the end, a NUL, not UTF-8, no `=`, an empty or invalid key.
    Malformed,
}

/// One line: `bytes[start..end]` without its `\n` and without one final `\r`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    /// First byte.
    pub start: usize,
    /// One past the last byte of the content (a final CR excluded).
    pub end: usize,
    /// Entry or not.
    pub kind: LineKind,
}

impl Line {
    /// The key and value of an entry, as byte ranges `(start..eq, eq + 1..end)`.
    #[must_use]
    pub fn entry(&self) -> Option<(usize, usize, usize)> {
        match self.kind {
            LineKind::Entry { eq } => Some((self.start, eq, self.end)),
            LineKind::Malformed => None,
        }
    }
}

/// The lines of `bytes`: split at `\n`, one final `\n` not starting a line, no line at all for
/// empty input.
#[derive(Debug, Clone)]
pub struct Lines<'a> {
    bytes: &'a [u8],
    /// Bytes to split (the input less one final `\n`).
    body_end: usize,
    pos: usize,
    done: bool,
}

impl<'a> Lines<'a> {
    /// Start at the first line.
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Self {
        let body_end = if bytes.last() == Some(&b'\n') {
            bytes.len() - 1
        } else {
            bytes.len()
        };
        Lines {
            bytes,
            body_end,
            pos: 0,
            done: bytes.is_empty(),
        }
    }
}

impl Iterator for Lines<'_> {
    type Item = Line;

    fn next(&mut self) -> Option<Line> {
        if self.done {
            return None;
        }
        let body = self.bytes.get(..self.body_end).unwrap_or_default();
        let rest = body.get(self.pos..).unwrap_or_default();
        let start = self.pos;
        let raw_end = match rest.iter().position(|b| *b == b'\n') {
            Some(i) => {
                self.pos = start + i + 1;
                start + i
            }
            None => {
                self.done = true;
                body.len()
            }
        };
        let raw = body.get(start..raw_end).unwrap_or_default();
        Some(classify(raw, start))
    }
}

fn classify(raw: &[u8], start: usize) -> Line {
    let malformed = |end| Line {
        start,
        end,
        kind: LineKind::Malformed,
    };
    let full_end = start + raw.len();
    if raw.len() + 1 > MAX_LINE_BYTES {
        return malformed(full_end);
    }
    let content = raw.strip_suffix(b"\r").unwrap_or(raw);
    let end = start + content.len();
    if content.iter().any(|b| *b == b'\r' || *b == 0) || core::str::from_utf8(content).is_err() {
        return malformed(end);
    }
    let Some(eq) = content.iter().position(|b| *b == b'=') else {
        return malformed(end);
    };
    if !is_valid_key(content.get(..eq).unwrap_or_default()) {
        return malformed(end);
    }
    Line {
        start,
        end,
        kind: LineKind::Entry { eq: start + eq },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(bytes: &[u8]) -> ([Option<bool>; 8], usize) {
        let mut out = [None; 8];
        let mut n = 0;
        for (i, l) in Lines::new(bytes).enumerate() {
            if let Some(slot) = out.get_mut(i) {
                *slot = Some(matches!(l.kind, LineKind::Entry { .. }));
            }
            n += 1;
        }
        (out, n)
    }

    #[test]
    fn splitting_like_the_contract_parser() {
        assert_eq!(kinds(b"").1, 0);
        assert_eq!(kinds(b"\n").1, 1);
        assert_eq!(kinds(b"A=1\n").0[..1], [Some(true)]);
        assert_eq!(kinds(b"A=1").0[..1], [Some(true)]);
        assert_eq!(
            kinds(b"A=1\n\nB=2\n").0[..3],
            [Some(true), Some(false), Some(true)]
        );
        assert_eq!(kinds(b"A=1\r\n").0[..1], [Some(true)]);
        assert_eq!(kinds(b"A=1\r\r\n").0[..1], [Some(false)]);
        assert_eq!(kinds(b"a=1\n=1\nA\n_=\xff\nA=\0\n").1, 5);
        assert!(
            kinds(b"a=1\n=1\nA\n_=\xff\nA=\0\n").0[..5]
                .iter()
                .all(|k| *k == Some(false))
        );
        let l = Lines::new(b"AB=cd\r\n").next();
        assert_eq!(
            l,
            Some(Line {
                start: 0,
                end: 5,
                kind: LineKind::Entry { eq: 2 }
            })
        );
    }
}
