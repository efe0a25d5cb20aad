//! Task outputs: small named values a task hands to the tasks downstream of
//! it (Airflow's XCom, GitHub Actions' step outputs).
//!
//! A shell task writes `key=value` lines (or one JSON object) to the file
//! named by `$DAGCRON_OUTPUTS`; an http task names what to take from its
//! JSON answer (`outputs: { id: "$.id" }`); a WebAssembly module writes the
//! same file inside its sandbox. The values are stored with the attempt
//! and reach the tasks downstream wherever they run: as
//! `{{tasks.extract.outputs.rows}}` in the places `{{params.x}}` works
//! (with the same quoting: a value is data, never shell code), as
//! `DAGCRON_OUTPUT_EXTRACT_ROWS` variables, and in `when` conditions.
//!
//! Everything here is pure: reading what a task wrote, the limits, the
//! names of the variables, and the references a task's text makes.

use std::collections::BTreeMap;

/// A task's outputs: names to values.
pub type Outputs = BTreeMap<String, String>;

/// The most outputs one attempt may have.
pub const MAX_KEYS: usize = 64;

/// The longest output name, in bytes.
pub const MAX_KEY: usize = 64;

/// The most bytes of names and values, together, one attempt may write.
pub const MAX_TOTAL: usize = 64 * 1024;

/// The most bytes of names and values the tasks of one run may hand
/// downstream together: a run keeps its outputs with it (in memory while it
/// runs, in its stored row), so they are bounded per run as well.
pub const MAX_RUN_TOTAL: usize = 1024 * 1024;

/// The bytes of names and values of `outputs`.
pub fn size(outputs: &Outputs) -> usize {
    outputs.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// Whether a task may add `outputs` to a run whose other tasks hold
/// `others` bytes of outputs: refused beyond [`MAX_RUN_TOTAL`].
pub fn within_run(outputs: &Outputs, others: usize) -> Result<(), OutputsError> {
    let total = others + size(outputs);
    if total > MAX_RUN_TOTAL {
        return Err(OutputsError(format!(
            "the run's tasks would hold {total} bytes of outputs; at most {MAX_RUN_TOTAL} are taken"
        )));
    }
    Ok(())
}

/// Why a task's outputs are refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputsError(pub String);

impl std::fmt::Display for OutputsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the task's outputs: {}", self.0)
    }
}

impl std::error::Error for OutputsError {}

/// Whether `name` may name an output: 1 to [`MAX_KEY`] letters, digits and
/// `_`, not starting with a digit (as run parameters).
pub fn valid_key(name: &str) -> bool {
    name.len() <= MAX_KEY
        && name.bytes().next().is_some_and(|b| !b.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Reads what a task wrote to its outputs file: one JSON object (a string
/// value as it is, any other value as JSON), or lines of `key=value` and
/// multi-line values as `key<<END`, the lines, then `END` (GitHub Actions'
/// form). Empty lines are ignored; a key written twice keeps its last value.
pub fn parse(bytes: &[u8]) -> Result<Outputs, OutputsError> {
    let bad = |m: String| Err(OutputsError(m));
    if bytes.len() > MAX_TOTAL * 2 {
        return bad(format!(
            "the file holds {} bytes; at most {MAX_TOTAL} of names and values are taken",
            bytes.len()
        ));
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return bad("the file is not UTF-8 text".into());
    };
    let mut out = Outputs::new();
    if text.trim_start().starts_with('{') {
        let object: serde_json::Map<String, serde_json::Value> = match serde_json::from_str(text) {
            Ok(o) => o,
            Err(e) => {
                return bad(format!(
                    "the file starts with {{ but is not one JSON object: {e}"
                ));
            }
        };
        for (k, v) in object {
            let value = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            out.insert(k, value);
        }
    } else {
        let mut lines = text.lines().enumerate();
        while let Some((n, line)) = lines.next() {
            if line.trim().is_empty() {
                continue;
            }
            if let Some((key, end)) = line.split_once("<<")
                && !key.contains('=')
            {
                let (key, end) = (key.trim(), end.trim());
                if end.is_empty() {
                    return bad(format!("line {}: `{key}<<` needs an end marker", n + 1));
                }
                let mut value: Vec<&str> = Vec::new();
                let mut closed = false;
                for (_, l) in lines.by_ref() {
                    if l == end {
                        closed = true;
                        break;
                    }
                    value.push(l);
                }
                if !closed {
                    return bad(format!(
                        "line {}: the value of {key} is not ended by a line `{end}`",
                        n + 1
                    ));
                }
                out.insert(key.to_string(), value.join("\n"));
            } else if let Some((key, value)) = line.split_once('=') {
                out.insert(key.trim().to_string(), value.to_string());
            } else {
                // The line itself is not quoted: it may be a secret
                // written there by mistake.
                return bad(format!(
                    "line {}: expected key=value (or key<<END, lines, END)",
                    n + 1
                ));
            }
        }
    }
    check(&out)?;
    Ok(out)
}

/// Checks outputs against the limits: names, their number, NUL bytes and
/// the total size.
pub fn check(outputs: &Outputs) -> Result<(), OutputsError> {
    if outputs.len() > MAX_KEYS {
        return Err(OutputsError(format!(
            "{} outputs; at most {MAX_KEYS} are taken",
            outputs.len()
        )));
    }
    for (k, v) in outputs {
        if !valid_key(k) {
            return Err(OutputsError(format!(
                "invalid output name {:?}: use 1 to {MAX_KEY} letters, digits and `_`, not starting with a digit",
                cut(k, 80)
            )));
        }
        if v.contains('\0') {
            return Err(OutputsError(format!("the value of {k} holds a NUL byte")));
        }
    }
    let total = size(outputs);
    if total > MAX_TOTAL {
        return Err(OutputsError(format!(
            "{total} bytes of names and values; at most {MAX_TOTAL} are taken"
        )));
    }
    Ok(())
}

fn cut(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

/// The variable a task gets an upstream task's output in:
/// `DAGCRON_OUTPUT_<TASK>_<KEY>`, upper case, other characters than
/// letters and digits as `_`.
pub fn env_name(task: &str, key: &str) -> String {
    let upper = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("DAGCRON_OUTPUT_{}_{}", upper(task), upper(key))
}

/// An output a task's text refers to: `{{tasks.<task>.outputs.<key>}}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ref {
    /// The upstream task.
    pub task: String,
    /// The output's name.
    pub key: String,
}

/// The outputs `text` refers to through `{{tasks.<task>.outputs.<key>}}`
/// placeholders, each in order, or why a placeholder under `tasks.` is not
/// of that form.
pub fn references(text: &str) -> Vec<Result<Ref, String>> {
    let mut out = Vec::new();
    for rest in text.split("{{").skip(1) {
        let Some(inside) = rest.split("}}").next() else {
            continue;
        };
        let inside = inside.trim();
        let Some(path) = inside.strip_prefix("tasks.") else {
            continue;
        };
        out.push(reference(path).ok_or_else(|| {
            format!("`{{{{{inside}}}}}` is not of the form {{{{tasks.<task>.outputs.<name>}}}}")
        }));
    }
    out
}

/// `<task>.outputs.<key>` as a reference (a task id may hold dots).
pub(crate) fn reference(path: &str) -> Option<Ref> {
    let (task, key) = path.split_once(".outputs.")?;
    (!task.is_empty() && valid_key(key)).then(|| Ref {
        task: task.to_string(),
        key: key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Outputs {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn lines_and_heredocs_are_read() {
        let file = b"rows=42\nfile=/tmp/x=y.csv\n\nnote<<EOF\nfirst\nsecond\nEOF\nrows=43\n";
        assert_eq!(
            parse(file).unwrap(),
            map(&[
                ("rows", "43"),
                ("file", "/tmp/x=y.csv"),
                ("note", "first\nsecond")
            ])
        );
        assert_eq!(parse(b"").unwrap(), Outputs::new());
    }

    #[test]
    fn a_json_object_is_read_with_non_strings_as_json() {
        let file = br#"{"rows": 42, "ok": true, "parts": ["a","b"], "name": "x"}"#;
        assert_eq!(
            parse(file).unwrap(),
            map(&[
                ("rows", "42"),
                ("ok", "true"),
                ("parts", r#"["a","b"]"#),
                ("name", "x")
            ])
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let err = |b: &[u8]| parse(b).unwrap_err().to_string();
        assert!(err(b"rows 42").contains("line 1: expected key=value"));
        assert!(err(b"note<<EOF\nx\n").contains("not ended by a line `EOF`"));
        assert!(err(b"1x=2").contains("invalid output name \"1x\""));
        assert!(err(b"a-b=2").contains("invalid output name"));
        assert!(err(b"{not json").contains("not one JSON object"));
        assert!(err(b"\xff=1").contains("not UTF-8"));
        assert!(err(b"{\"a\": \"x\\u0000y\"}").contains("NUL"));
        let many: String = (0..=MAX_KEYS).map(|i| format!("k{i}=v\n")).collect();
        assert!(err(many.as_bytes()).contains("65 outputs"));
        let big = format!("k={}", "x".repeat(MAX_TOTAL));
        assert!(err(big.as_bytes()).contains("at most 65536 are taken"));
    }

    #[test]
    fn variables_are_named_by_task_and_key() {
        assert_eq!(env_name("extract", "rows"), "DAGCRON_OUTPUT_EXTRACT_ROWS");
        assert_eq!(
            env_name("load-eu", "row_count"),
            "DAGCRON_OUTPUT_LOAD_EU_ROW_COUNT"
        );
    }

    #[test]
    fn references_are_found_and_malformed_ones_named() {
        assert_eq!(
            references("x {{ tasks.a.outputs.rows }} {{params.p}} {{tasks.b-2.outputs.f}}"),
            vec![
                Ok(Ref {
                    task: "a".into(),
                    key: "rows".into()
                }),
                Ok(Ref {
                    task: "b-2".into(),
                    key: "f".into()
                })
            ]
        );
        assert_eq!(
            references("{{tasks.load.eu.outputs.rows}}"),
            [Ok(Ref {
                task: "load.eu".into(),
                key: "rows".into()
            })],
            "a task id with a dot"
        );
        let found = references("{{tasks.a.rows}} {{tasks.a.outputs.}} {{tasks.b.outputs.x}}");
        assert!(
            found[0]
                .as_ref()
                .unwrap_err()
                .contains("`{{tasks.a.rows}}` is not of the form")
        );
        assert!(found[1].is_err());
        assert!(found[2].is_ok());
    }

    proptest::proptest! {
        /// Whatever a task writes, reading it never panics, and what is
        /// read keeps to the limits.
        #[test]
        fn any_file_is_read_within_the_limits(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
            if let Ok(out) = parse(&bytes) {
                proptest::prop_assert!(check(&out).is_ok());
            }
        }

        /// Lines written as `key=value` read back as written.
        #[test]
        fn written_lines_read_back(pairs in proptest::collection::btree_map("[a-z_][a-z0-9_]{0,10}", "[^\n\r\u{0}]{0,30}", 0..10)) {
            let file: String = pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            proptest::prop_assert_eq!(parse(file.as_bytes()).unwrap(), pairs);
        }
    }
}
