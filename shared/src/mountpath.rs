//! Mount paths compared as the container runtime sees them: lexically cleaned, as Go's
//! `path.Clean` does (kubelet and the runtimes are Go), so that `/overrideEnv/`, `//overrideEnv`,
//! `/./overrideEnv` and `/tmp/../overrideEnv` are all `/overrideEnv`.

use std::borrow::Cow;

/// The shortest path equivalent to `path` by purely lexical processing, as Go's `path.Clean`:
/// repeated `/` become one, `.` elements go, each `..` removes the element before it, `..` at the
/// root of a rooted path is dropped, a trailing `/` goes (except for `/` itself), and an empty
/// result is `.`. Symbolic links are not followed (there is no file system to ask).
#[must_use]
pub fn clean(path: &str) -> Cow<'_, str> {
    if is_clean(path) {
        return Cow::Borrowed(path);
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    // How many leading `..` a relative path keeps (they cannot be removed).
    let mut kept_up = 0usize;
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.len() > kept_up {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                    kept_up += 1;
                }
            }
            other => parts.push(other),
        }
    }
    let mut out = String::with_capacity(path.len());
    if rooted {
        out.push('/');
    }
    out.push_str(&parts.join("/"));
    if out.is_empty() {
        out.push('.');
    }
    Cow::Owned(out)
}

/// Whether `clean(path)` would surely return `path` itself (a relative path with `..` is copied).
fn is_clean(path: &str) -> bool {
    if path.is_empty() {
        return false;
    }
    if path == "/" {
        return true;
    }
    if path.ends_with('/') {
        return false;
    }
    let rest = path.strip_prefix('/').unwrap_or(path);
    rest.split('/')
        .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// A container mount path as the runtime resolves it: cleaned, and a relative path taken from
/// `/` (the working directory a runtime starts from unless the image says otherwise; reading it
/// from `/` errs towards finding a clash).
#[must_use]
pub fn resolve(mount_path: &str) -> Cow<'_, str> {
    if mount_path.starts_with('/') {
        clean(mount_path)
    } else {
        Cow::Owned(clean(&format!("/{mount_path}")).into_owned())
    }
}

/// How a mount at `theirs` stands to one at `ours` (both resolved with [`resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// The same path: one of the two mounts wins.
    Same,
    /// `theirs` is a folder above `ours`: it may hide it.
    Above,
    /// `theirs` is below `ours`: it replaces part of what `ours` provides.
    Below,
}

impl Overlap {
    /// How to say it in a message.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Same => "at the same path as",
            Self::Above => "above",
            Self::Below => "inside",
        }
    }
}

/// The overlap of `theirs` with `ours`, both already resolved.
#[must_use]
pub fn overlap(theirs: &str, ours: &str) -> Option<Overlap> {
    let below = |inner: &str, outer: &str| {
        outer == "/"
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    if theirs == ours {
        Some(Overlap::Same)
    } else if below(ours, theirs) {
        Some(Overlap::Above)
    } else if below(theirs, ours) {
        Some(Overlap::Below)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_matches_go_path_clean() {
        // Go's own path.Clean test table (src/path/path_test.go), plus the tester's spellings.
        let cases: &[(&str, &str)] = &[
            ("", "."),
            ("abc", "abc"),
            ("abc/def", "abc/def"),
            ("a/b/c", "a/b/c"),
            (".", "."),
            ("..", ".."),
            ("../..", "../.."),
            ("../../abc", "../../abc"),
            ("/abc", "/abc"),
            ("/", "/"),
            ("abc/", "abc"),
            ("abc/def/", "abc/def"),
            ("a/b/c/", "a/b/c"),
            ("./", "."),
            ("../", ".."),
            ("../../", "../.."),
            ("/abc/", "/abc"),
            ("abc//def//ghi", "abc/def/ghi"),
            ("//abc", "/abc"),
            ("///abc", "/abc"),
            ("//abc//", "/abc"),
            ("abc//", "abc"),
            ("abc/./def", "abc/def"),
            ("/./abc/def", "/abc/def"),
            ("abc/.", "abc"),
            ("abc/def/ghi/../jkl", "abc/def/jkl"),
            ("abc/def/../ghi/../jkl", "abc/jkl"),
            ("abc/def/..", "abc"),
            ("abc/def/../..", "."),
            ("/abc/def/../..", "/"),
            ("abc/def/../../..", ".."),
            ("/abc/def/../../..", "/"),
            ("abc/def/../../../ghi/jkl/../../../mno", "../../mno"),
            ("abc/./../def", "def"),
            ("abc//./../def", "def"),
            ("abc/../../././../def", "../../def"),
            ("/overrideEnv/", "/overrideEnv"),
            ("//overrideEnv", "/overrideEnv"),
            ("/./overrideEnv", "/overrideEnv"),
            ("/tmp/../overrideEnv", "/overrideEnv"),
            ("/../overrideEnv", "/overrideEnv"),
            ("/etc/./ld.so.preload", "/etc/ld.so.preload"),
            ("/usr/local//vgpu/", "/usr/local/vgpu"),
        ];
        for &(input, want) in cases {
            assert_eq!(clean(input), want, "clean({input:?})");
            // Idempotent, and a clean rooted path is returned without a copy.
            assert_eq!(clean(want), want, "clean({want:?})");
            if want.starts_with('/') {
                assert!(matches!(clean(want), Cow::Borrowed(_)), "{want:?}");
            }
        }
    }

    #[test]
    fn relative_mount_paths_resolve_from_the_root() {
        assert_eq!(resolve("overrideEnv"), "/overrideEnv");
        assert_eq!(resolve("../etc/ld.so.preload"), "/etc/ld.so.preload");
        assert_eq!(resolve("/etc/"), "/etc");
        assert_eq!(resolve(""), "/");
    }

    #[test]
    fn overlap_table() {
        let cases: &[(&str, &str, Option<Overlap>)] = &[
            ("/overrideEnv", "/overrideEnv", Some(Overlap::Same)),
            ("/", "/overrideEnv", Some(Overlap::Above)),
            ("/etc", "/etc/ld.so.preload", Some(Overlap::Above)),
            ("/usr", "/usr/local/vgpu", Some(Overlap::Above)),
            (
                "/usr/local/vgpu/libvgpu.so",
                "/usr/local/vgpu",
                Some(Overlap::Below),
            ),
            ("/overrideEnvX", "/overrideEnv", None),
            ("/overrideEn", "/overrideEnv", None),
            ("/et", "/etc/ld.so.preload", None),
            ("/etc/ld.so.preload.d", "/etc/ld.so.preload", None),
            ("/usr/local/vgpu2", "/usr/local/vgpu", None),
            ("/data", "/overrideEnv", None),
        ];
        for &(theirs, ours, want) in cases {
            assert_eq!(overlap(theirs, ours), want, "{theirs} vs {ours}");
        }
    }
}
