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
    let kept: Vec<&str> = yaml.lines().filter(|line| !is_unset(line)).collect();
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
