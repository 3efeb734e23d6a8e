//! Markdown as the documentation tests read it (`tests/tests/it/docs_links.rs`,
//! `docs_config_reference.rs`, `readme_commands.rs`): the prose outside code fences, headings and
//! the anchors GitHub gives them, relative links, sections, table rows and their code spans.
//!
//! Only what `README.md` and `docs/*.md` use: ATX headings (`## Title`), inline links
//! (`[text](target)`), pipe tables, fenced code blocks (```` ``` ````).

use std::collections::BTreeSet;

/// One line of a Markdown file, numbered from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line<'a> {
    /// 1-based line number.
    pub number: usize,
    /// The line, without its newline.
    pub text: &'a str,
}

/// The lines outside fenced code blocks (the fence lines themselves left out).
#[must_use]
pub fn prose_lines(markdown: &str) -> Vec<Line<'_>> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (i, text) in markdown.lines().enumerate() {
        let trimmed = text.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push(Line {
                number: i + 1,
                text,
            }),
            _ => {}
        }
    }
    lines
}

/// The fenced code blocks whose info string is `lang` (e.g. `sh`), as their lines.
#[must_use]
pub fn code_blocks<'a>(markdown: &'a str, lang: &str) -> Vec<Vec<Line<'a>>> {
    let mut blocks = Vec::new();
    let mut current: Option<(bool, Vec<Line<'a>>)> = None;
    for (i, text) in markdown.lines().enumerate() {
        let trimmed = text.trim_start();
        match current.as_mut() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    current = Some((info.trim() == lang, Vec::new()));
                }
            }
            Some((wanted, lines)) => {
                if trimmed.starts_with("```") {
                    if *wanted {
                        blocks.push(std::mem::take(lines));
                    }
                    current = None;
                } else {
                    lines.push(Line {
                        number: i + 1,
                        text,
                    });
                }
            }
        }
    }
    blocks
}

/// An ATX heading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heading {
    /// 1 for `#`, 2 for `##`, …
    pub level: usize,
    /// The heading's text as written (Markdown included).
    pub text: String,
    /// 1-based line number.
    pub line: usize,
}

/// The headings outside code fences, in order.
#[must_use]
pub fn headings(markdown: &str) -> Vec<Heading> {
    prose_lines(markdown)
        .into_iter()
        .filter_map(|line| {
            let level = line.text.bytes().take_while(|&b| b == b'#').count();
            let rest = &line.text[level..];
            ((1..=6).contains(&level) && rest.starts_with(' ')).then(|| Heading {
                level,
                text: rest.trim().trim_end_matches('#').trim().to_owned(),
                line: line.number,
            })
        })
        .collect()
}

/// The text a heading renders to: code-span backticks dropped, a link replaced by its text.
#[must_use]
pub fn rendered_text(markdown: &str) -> String {
    let mut out = String::new();
    let mut rest = markdown;
    while let Some(c) = rest.chars().next() {
        if c == '['
            && let Some(close) = rest.find("](")
            && let Some(end) = rest[close..].find(')')
        {
            out.push_str(&rest[1..close]);
            rest = &rest[close + end + 1..];
            continue;
        }
        if c != '`' {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// GitHub's anchor for a heading text: the rendered text lowercased, every character that is not
/// a letter, digit, `-`, `_` or space removed, spaces turned into `-`.
#[must_use]
pub fn github_slug(heading: &str) -> String {
    rendered_text(heading)
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a file: its headings' slugs, a repeated slug numbered `-1`, `-2`, … as GitHub
/// numbers them.
#[must_use]
pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut out = BTreeSet::new();
    for h in headings(markdown) {
        let slug = github_slug(&h.text);
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 { slug } else { format!("{slug}-{n}") });
        *n += 1;
    }
    out
}

/// `line` with its code spans (`` `...` ``) removed: what is left is prose.
#[must_use]
pub fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The code spans of `text`, without their backticks.
#[must_use]
pub fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_owned())
        .collect()
}

/// An inline link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// 1-based line number.
    pub line: usize,
    /// The target as written: `path`, `path#anchor`, `#anchor` or a URL.
    pub target: String,
}

/// The inline links (and images) outside code fences and code spans.
#[must_use]
pub fn links(markdown: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for line in prose_lines(markdown) {
        let prose = without_code_spans(line.text);
        let mut rest = prose.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            if !target.is_empty() {
                out.push(Link {
                    line: line.number,
                    target: target.to_owned(),
                });
            }
            rest = &after[end..];
        }
    }
    out
}

/// The text of the section under the first heading whose rendered text is `title`: from the
/// heading to the next heading of the same or a higher level. `None` when there is no such
/// heading.
#[must_use]
pub fn section(markdown: &str, title: &str) -> Option<String> {
    let all = headings(markdown);
    let pos = all.iter().position(|h| rendered_text(&h.text) == title)?;
    let level = all[pos].level;
    let start = all[pos].line - 1;
    let lines: Vec<&str> = markdown.lines().collect();
    let end = all[pos + 1..]
        .iter()
        .find(|h| h.level <= level)
        .map_or(lines.len(), |h| h.line - 1);
    Some(lines[start..end].join("\n"))
}

/// One row of a pipe table: its cells, trimmed (`\|` is kept as a `|` inside a cell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// 1-based line number within the text it was read from.
    pub line: usize,
    /// The cells.
    pub cells: Vec<String>,
}

/// The body rows of every pipe table in `text` (header and `|---|` rows left out), outside code
/// fences.
#[must_use]
pub fn table_rows(text: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut header_seen = false;
    for line in prose_lines(text) {
        let t = line.text.trim();
        if !t.starts_with('|') {
            header_seen = false;
            continue;
        }
        let cells = split_cells(t);
        let is_rule = cells
            .iter()
            .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':')));
        if is_rule {
            header_seen = true;
            continue;
        }
        if header_seen {
            rows.push(Row {
                line: line.number,
                cells,
            });
        }
    }
    rows
}

fn split_cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_owned()),
            _ => cell.push(c),
        }
    }
    cells.push(cell.trim().to_owned());
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_as_github_makes_them() {
        assert_eq!(
            github_slug("hami-webhook: the admission webhook"),
            "hami-webhook-the-admission-webhook"
        );
        assert_eq!(
            github_slug("The preload library: `libhami_preload.so` (`preload/`)"),
            "the-preload-library-libhami_preloadso-preload"
        );
        assert_eq!(
            github_slug("A real node (`scripts/cluster up --with-chart`)"),
            "a-real-node-scriptscluster-up---with-chart"
        );
        assert_eq!(github_slug("Defaults, and why"), "defaults-and-why");
        assert_eq!(github_slug("HAMi's vGPU monitor"), "hamis-vgpu-monitor");
    }

    #[test]
    fn repeated_headings_are_numbered_and_fences_are_skipped() {
        let md = "# A\n## Tests\n```sh\n# not a heading\n```\n## Tests\n";
        let a = anchors(md);
        assert!(a.contains("tests") && a.contains("tests-1") && !a.contains("not-a-heading"));
    }

    #[test]
    fn links_outside_code() {
        let md = "see [x](a.md#b) and `[y](no.md)`\n```\n[z](no.md)\n```\n";
        let l = links(md);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].target, "a.md#b");
    }

    #[test]
    fn tables_and_sections() {
        let md = "## S\n\n| k | v |\n|---|---|\n| `a` | x \\| y |\n## T\n| k |\n|---|\n| `b` |\n";
        let s = section(md, "S").unwrap_or_default();
        let rows = table_rows(&s);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].cells, ["`a`", "x | y"]);
        assert_eq!(code_spans(&rows[0].cells[0]), ["a"]);
    }
}
