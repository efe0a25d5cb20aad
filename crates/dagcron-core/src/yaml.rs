//! How a YAML job file that cannot be read is reported: where (the file's
//! own name, line and column, with the lines around it) and, for a field
//! nobody knows, the known field it most likely meant. And how a stored
//! job is shown as YAML, and two of its versions compared.

use std::borrow::Cow;

use serde_saphyr::{DefaultMessageFormatter, Error, MessageFormatter, RenderOptions};

/// A stored spec as YAML, in its canonical form: the fields of a job file
/// in their declared order, every default written out, the fields left
/// unset (`null`) left out. A spec this build no longer reads is shown as
/// stored.
pub fn canonical_yaml(spec: &serde_json::Value) -> Result<String, String> {
    let yaml = match serde_json::from_value::<crate::JobSpec>(spec.clone()) {
        Ok(parsed) => serde_saphyr::to_string(&parsed),
        Err(_) => serde_saphyr::to_string(spec),
    };
    let yaml = yaml.map_err(|e| format!("writing the spec as YAML: {e}"))?;
    // The lines of a block scalar (`|`, `>`) are text: never left out.
    let mut block: Option<usize> = None;
    let kept: Vec<&str> = yaml
        .lines()
        .filter(|line| {
            let indent = line.len() - line.trim_start().len();
            if let Some(at) = block {
                if line.trim().is_empty() || indent > at {
                    return true;
                }
                block = None;
            }
            let head = line.trim_end();
            if head.ends_with('|')
                || head.ends_with('>')
                || head.ends_with("|-")
                || head.ends_with(">-")
                || head.ends_with("|+")
                || head.ends_with(">+")
            {
                block = Some(indent);
            }
            !is_unset(line)
        })
        .collect();
    Ok(kept.join("\n") + "\n")
}

/// Whether a line of YAML is a field left unset: `key: null` (a string
/// `null` is quoted; the first key of a list item, `- id: ...`, is never
/// unset).
fn is_unset(line: &str) -> bool {
    let line = line.trim_start();
    !line.starts_with("- ")
        && line.split_once(": ").is_some_and(|(key, value)| {
            value == "null"
                && !key.is_empty()
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// A unified diff of two texts, line by line, with three lines of
/// context; empty when they are equal.
pub fn unified_diff(from_label: &str, from: &str, to_label: &str, to: &str) -> String {
    if from == to {
        return String::new();
    }
    similar::TextDiff::from_lines(from, to)
        .unified_diff()
        .context_radius(3)
        .header(from_label, to_label)
        .to_string()
}

/// The words of the default formatter, with a suggestion for an unknown
/// field or variant.
struct Hints;

impl MessageFormatter for Hints {
    fn format_message<'a>(&self, err: &'a Error) -> Cow<'a, str> {
        let (unknown, expected, what) = match err {
            Error::SerdeUnknownField {
                field, expected, ..
            } => (field, expected, "field"),
            Error::SerdeUnknownVariant {
                variant, expected, ..
            } => (variant, expected, "value"),
            _ => return DefaultMessageFormatter.format_message(err),
        };
        let message = match closest(unknown, expected) {
            Some(meant) => format!("unknown {what} `{unknown}`: did you mean `{meant}`?"),
            None => format!(
                "unknown {what} `{unknown}`, expected one of {}",
                expected.join(", ")
            ),
        };
        Cow::Owned(message)
    }
}

/// The text of `err`, met reading `source_name`: what is wrong, at which
/// line and column of that file, with the lines around it.
pub fn describe(err: &Error, source_name: &str) -> String {
    let mut options = RenderOptions::new(&Hints);
    options.source_name = Some(source_name);
    let text = err.render_with_options(options);
    // The caller says that it is an error.
    match text.strip_prefix("error: ") {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

/// At most this many unknown fields are reported for one file.
const MAX_UNKNOWN: usize = 20;
/// A file longer than this is read once: its first problem is reported.
const MAX_REREAD: usize = 256 << 10;

/// Reads `text` (from `source_name`) as a `T`, reporting every unknown
/// field in one pass, each as [`describe`] writes it: after an unknown
/// field, its entry (its line and the more indented lines under it) is
/// commented out and the text read again. The first problem of another
/// kind ends the reading (it is reported too), and so does an unknown
/// field whose entry cannot be left out alone (the first of a list item,
/// or inside `{ }`).
pub fn from_str_all<T: serde::de::DeserializeOwned>(
    text: &str,
    source_name: &str,
) -> Result<T, Vec<String>> {
    // `\r` alone does not end a line here as it does for the reader: such a
    // file is read once.
    let lone_cr = text.replace("\r\n", "").contains('\r');
    let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
    let mut problems = Vec::new();
    loop {
        let err = match serde_saphyr::from_str::<T>(&lines.join("\n")) {
            Ok(v) if problems.is_empty() => return Ok(v),
            Ok(_) => return Err(problems),
            Err(e) => e,
        };
        problems.push(describe(&err, source_name));
        let unknown = matches!(err.without_snippet(), Error::SerdeUnknownField { .. })
            && text.len() <= MAX_REREAD
            && !lone_cr;
        let at = err
            .location()
            .map(|l| (l.line() as usize, l.column() as usize));
        match at {
            Some((line, column))
                if unknown
                    && problems.len() < MAX_UNKNOWN
                    && leave_out(&mut lines, line.saturating_sub(1), column.saturating_sub(1)) => {}
            _ => return Err(problems),
        }
    }
}

/// Comments out the entry whose key starts at `column` (in characters) of
/// line `row`, and the lines under it indented deeper; `false` when the
/// entry cannot be left out alone.
fn leave_out(lines: &mut [String], row: usize, column: usize) -> bool {
    let Some(line) = lines.get(row) else {
        return false;
    };
    let before: String = line.chars().take(column).collect();
    // Only a key alone at the start of its line: not `- key:` nor `{ key: }`.
    if before.chars().any(|c| !c.is_whitespace()) || line.trim_start().starts_with('#') {
        return false;
    }
    lines[row] = format!("{before}#{}", line.chars().skip(column).collect::<String>());
    for next in lines.iter_mut().skip(row + 1) {
        let indent = next.chars().take_while(|c| *c == ' ').count();
        if next.trim().is_empty() {
            continue;
        }
        if indent <= column {
            break;
        }
        next.insert(indent, '#');
    }
    true
}

/// Of `known`, the word nearest `word` if it is near enough to be a typo
/// (at most a third of its letters changed, and at most 3).
pub fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    let most = (word.chars().count() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| (distance(word, k), *k))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein's edit distance, by characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobFile;

    fn error_of(yaml: &str) -> Error {
        serde_saphyr::from_str::<JobFile>(yaml).unwrap_err()
    }

    /// Two typos, one with a block under it, and a third in another job:
    /// all three in one pass, each at its line, with the field meant.
    #[test]
    fn every_misspelt_field_of_a_file_is_reported_at_once() {
        let yaml = "namespace: t\njobs:\n  - name: a\n    schedul: \"* * * * *\"\n    retri:\n      max_attempts: 3\n    tasks: [{ id: x, noop: true }]\n  - name: b\n    tasks: [{ id: y, noop: true }]\n    paused: true\n    timezon: UTC\n";
        let problems = from_str_all::<JobFile>(yaml, "etl.yaml").unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].contains("`schedul`: did you mean `schedule`?")
                && problems[0].contains("etl.yaml:4:5"),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].contains("`retri`: did you mean `retry`?")
                && problems[1].contains("etl.yaml:5:5"),
            "{}",
            problems[1]
        );
        assert!(
            problems[2].contains("`timezon`: did you mean `timezone`?")
                && problems[2].contains("etl.yaml:11:5"),
            "{}",
            problems[2]
        );
        // A file without problems reads as it would alone.
        let ok = "namespace: t\njobs:\n  - name: a\n    tasks: [{ id: x, noop: true }]\n";
        assert!(from_str_all::<JobFile>(ok, "ok.yaml").is_ok());
        // An unknown field that starts a list item cannot be left out
        // alone: the reading ends there, with it.
        let first =
            "namespace: t\njobs:\n  - nam: a\n    tasks: [{ id: x, noop: true }]\n    retyr: 3\n";
        let problems = from_str_all::<JobFile>(first, "f.yaml").unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].contains("`nam`"), "{}", problems[0]);
    }

    /// Lines of a block scalar that read `key: null` are text, and stay.
    #[test]
    fn the_canonical_yaml_keeps_a_scripts_lines() {
        let spec = serde_json::json!({
            "name": "j",
            "tasks": [{ "id": "t", "shell": "set -e\nproxy: null\necho done\n" }]
        });
        let yaml = canonical_yaml(&spec).unwrap();
        assert!(yaml.contains("proxy: null"), "{yaml}");
        assert!(!yaml.contains("deadline: null"), "{yaml}");
    }

    /// A typo was reported with every field of a job listed, at `<input>`,
    /// after a second `error:`.
    #[test]
    fn a_misspelt_field_names_the_field_meant_and_the_file() {
        let err = error_of("namespace: t\njobs:\n  - name: a\n    schedul: \"* * * * *\"\n");
        let text = describe(&err, "jobs/etl.yaml");
        assert!(
            text.contains("unknown field `schedul`: did you mean `schedule`?"),
            "{text}"
        );
        assert!(text.contains("jobs/etl.yaml:4:5"), "{text}");
        assert!(
            !text.contains("<input>") && !text.starts_with("error"),
            "{text}"
        );
    }

    #[test]
    fn a_field_like_none_lists_those_known() {
        let err = error_of("namespace: t\njobs:\n  - name: a\n    colour: blue\n");
        let text = describe(&err, "f.yaml");
        assert!(
            text.contains("unknown field `colour`, expected one of name, schedule"),
            "{text}"
        );
    }

    #[test]
    fn other_errors_keep_their_words() {
        let err = error_of("namespace: [\n");
        let text = describe(&err, "f.yaml");
        assert!(text.contains("f.yaml"), "{text}");
    }

    #[test]
    fn the_nearest_known_word_is_a_likely_typo_only() {
        let known = ["schedule", "timezone", "tasks", "retry"];
        assert_eq!(closest("schedul", &known), Some("schedule"));
        assert_eq!(closest("timzone", &known), Some("timezone"));
        assert_eq!(closest("taks", &known), Some("tasks"));
        assert_eq!(closest("rety", &known), Some("retry"));
        assert_eq!(closest("colour", &known), None);
        assert_eq!(closest("x", &known), None);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("día", "dia"), 1);
    }
}
