//! Manifests as people write them: the guard both offline readers (`hami-webhook mutate`,
//! `hami-device-plugin plan`) run before a YAML parser sees a pod file.

/// The deepest nesting of flow collections (`[`, `{`) a manifest reader accepts before parsing:
/// a real Pod is under 20 levels deep, and YAML parsers recurse past the point where they refuse.
pub const MAX_FLOW_DEPTH: usize = 256;

/// The deepest nesting of flow collections (`[`, `{`) outside quoted scalars: a cheap scan that
/// refuses pathological input before a YAML parser reads it. libyaml's flow parsing costs the
/// square of the depth (16,000 levels, 32 KB, take a second unoptimised) even where serde then
/// stops at its recursion limit. A quote opens a scalar only where a token starts, as in YAML: the
/// apostrophe in a plain scalar (`it's`) does not hide the brackets after it.
#[must_use]
pub fn flow_depth(text: &[u8]) -> usize {
    let (mut depth, mut max, mut quote) = (0usize, 0usize, None::<u8>);
    let (mut escaped, mut token_start) = (false, true);
    for &b in text {
        // `''` inside a single-quoted scalar is one quote: the second one reopens it.
        let mut closed_single = false;
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if b == b'\\' && q == b'"' {
                    escaped = true;
                } else if b == q {
                    quote = None;
                    closed_single = q == b'\'';
                }
            }
            None => match b {
                b'"' | b'\'' if token_start => quote = Some(b),
                b'[' | b'{' => {
                    depth += 1;
                    max = max.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        token_start = closed_single
            || (quote.is_none()
                && matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b',' | b'[' | b'{' | b':'));
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_depth_counts_brackets_outside_quoted_scalars() {
        assert_eq!(flow_depth(b"a: [[1], {b: [2]}]\n"), 3);
        assert_eq!(flow_depth(b"a: \"[[[\\\"[\"\nb: '[[['\n"), 0);
        assert_eq!(flow_depth(b"{\"a\":\"[\",\"b\":[[]]}"), 3);
        // An apostrophe inside a plain scalar opens nothing.
        assert_eq!(flow_depth(b"a: it's [[[x]]]\n"), 3);
        assert_eq!(flow_depth(b"a: 'it''s [' \nb: [[x]]\n"), 2);
        assert_eq!(flow_depth("[".repeat(300).as_bytes()), 300);
    }
}
