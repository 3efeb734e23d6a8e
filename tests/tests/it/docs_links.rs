//! Every relative link and `#anchor` in `README.md` and `docs/*.md` resolves: the file (or
//! folder) exists, and an anchor matches a heading of the target file by GitHub's slug rules. Text
//! moves between files; a link left pointing at the old place fails here, naming the file, the
//! line and the target.

use std::path::{Path, PathBuf};

use hami_tests::docs::{anchors, links};
use hami_tests::real::repo;

fn documents() -> Vec<PathBuf> {
    let root = repo();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds no .md file");
    files.extend(docs);
    files
}

fn shown(path: &Path) -> String {
    let root = repo().canonicalize().unwrap();
    let p = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    p.strip_prefix(&root)
        .map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let text = std::fs::read_to_string(&file).unwrap();
        for link in links(&text) {
            let t = link.target.as_str();
            // URLs (https:, mailto:) are not checked here: nothing outside the repository is.
            if t.split_once(':')
                .is_some_and(|(scheme, _)| scheme.chars().all(|c| c.is_ascii_alphabetic()))
            {
                continue;
            }
            checked += 1;
            let (path, anchor) = t.split_once('#').map_or((t, None), |(p, a)| (p, Some(a)));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let at = format!("{}:{}: ({t})", shown(&file), link.line);
            if !target.exists() {
                broken.push(format!("{at}: {} does not exist", target.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if target.extension().is_none_or(|x| x != "md") {
                broken.push(format!("{at}: an anchor into a file that is not Markdown"));
                continue;
            }
            let known = anchors(&std::fs::read_to_string(&target).unwrap());
            if !known.contains(anchor) {
                let near: Vec<&String> = known
                    .iter()
                    .filter(|a| {
                        a.split('-')
                            .any(|w| w.len() > 3 && anchor.split('-').any(|v| v == w))
                    })
                    .take(5)
                    .collect();
                broken.push(format!(
                    "{at}: no heading of {} has the anchor #{anchor} (similar: {near:?})",
                    shown(&target)
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
    assert!(
        checked > 50,
        "only {checked} relative links found: is the parser broken?"
    );
}

/// The README stays a front page: what it is, the quick start, the test command, the
/// architecture and the map of `docs/`; past a screenful or two a newcomer stops reading.
#[test]
fn readme_stays_short_and_links_every_doc() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; move text into docs/"
    );
    for doc in documents().iter().skip(1) {
        let name = format!("docs/{}", doc.file_name().unwrap().to_string_lossy());
        assert!(
            readme.contains(&format!("]({name})")),
            "README.md does not link {name}"
        );
    }
}
