//! Dynamic fan-out: a task with `for_each` runs once per item of a list
//! found when it may start (Airflow's `expand()`, Argo's `withParam`).
//!
//! The list is a literal one in the job file, or an upstream task's output
//! (or a run parameter) holding a JSON array. When the task may start, the
//! run state machine expands it into instances, one per item, each a task
//! of the run of its own (`name[0]`, `name[1]`, ...): its own attempts,
//! retries, logs and outputs, and `{{item}}` and `{{index}}` to work with.
//! The task itself runs nothing: it is `running` while its instances are,
//! and ends by theirs ([`gathered_state`]); downstream tasks see each of
//! its instances' outputs as a JSON list ([`gather`]).
//!
//! Everything here is pure: the sources, reading a list, the limits, the
//! instances' names, and what the instances' outcomes add up to.

use std::collections::BTreeMap;

use crate::outputs::{Outputs, Ref};
use crate::state::TaskState;

/// The most items one task expands into.
pub const MAX_ITEMS: usize = 1_000;

/// The most instances the mapped tasks of one run have together.
pub const MAX_INSTANCES: usize = 2_000;

/// The longest item, in bytes of its JSON.
pub const MAX_ITEM: usize = 8 * 1024;

/// The longest list of one output that a mapped task hands downstream, in
/// bytes of its JSON (a downstream shell task gets it in one variable).
pub const MAX_GATHERED: usize = 96 * 1024;

/// The most bytes of names and lists a mapped task hands downstream.
pub const MAX_GATHERED_TOTAL: usize = 256 * 1024;

/// What a task's `for_each` is, as written in a job file: a list, or a text
/// naming where the list is.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ForEach {
    /// The items themselves.
    Items(Vec<serde_json::Value>),
    /// `{{tasks.<task>.outputs.<name>}}` or `{{params.<name>}}`, whose
    /// value is a JSON array.
    From(String),
}

/// Where a mapped task's items come from, once checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// These items (each one's JSON).
    Items(Vec<String>),
    /// An upstream task's output.
    Output(Ref),
    /// A run parameter.
    Param(String),
}

impl Source {
    /// Checks a job file's `for_each`.
    pub fn parse(spec: &ForEach) -> Result<Source, String> {
        match spec {
            ForEach::Items(items) => {
                let items: Vec<String> = items.iter().map(|v| v.to_string()).collect();
                check_items(&items)?;
                Ok(Source::Items(items))
            }
            ForEach::From(text) => {
                let bad = || {
                    format!(
                        "`{}` is not one placeholder: write a list, `{{{{tasks.<task>.outputs.<name>}}}}` or `{{{{params.<name>}}}}`",
                        cut(text, 80)
                    )
                };
                let inside = text
                    .trim()
                    .strip_prefix("{{")
                    .and_then(|t| t.strip_suffix("}}"))
                    .filter(|t| !t.contains("{{") && !t.contains("}}"))
                    .ok_or_else(bad)?
                    .trim();
                if let Some(path) = inside.strip_prefix("tasks.") {
                    crate::outputs::reference(path)
                        .map(Source::Output)
                        .ok_or_else(bad)
                } else if let Some(name) = inside.strip_prefix("params.") {
                    (!name.is_empty())
                        .then(|| Source::Param(name.to_string()))
                        .ok_or_else(bad)
                } else {
                    Err(bad())
                }
            }
        }
    }

    /// The items, given the run's parameters and the outputs of the task
    /// named (none: it has none, or no such output), or why there are none
    /// to expand into.
    pub fn items(
        &self,
        params: &BTreeMap<String, String>,
        output: impl FnOnce(&Ref) -> Option<String>,
    ) -> Result<Vec<String>, String> {
        match self {
            Source::Items(items) => Ok(items.clone()),
            Source::Param(name) => match params.get(name) {
                Some(v) => list(v).map_err(|e| format!("parameter `{name}`: {e}")),
                None => Err(format!(
                    "the run has no parameter `{name}` to take items from"
                )),
            },
            Source::Output(r) => match output(r) {
                Some(v) => {
                    list(&v).map_err(|e| format!("output `{}` of task `{}`: {e}", r.key, r.task))
                }
                None => Err(format!(
                    "task `{}` gave no output `{}` to take items from",
                    r.task, r.key
                )),
            },
        }
    }
}

/// The items of a JSON array (each one's JSON), within the limits.
pub fn list(text: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|_| format!("`{}` is not a JSON array", cut(text, 80)))?;
    let serde_json::Value::Array(items) = value else {
        return Err(format!("`{}` is not a JSON array", cut(text, 80)));
    };
    if items.len() > MAX_ITEMS {
        return Err(too_many(items.len()));
    }
    let items: Vec<String> = items.iter().map(|v| v.to_string()).collect();
    check_items(&items)?;
    Ok(items)
}

fn too_many(n: usize) -> String {
    format!("{n} items; a task expands into at most {MAX_ITEMS}")
}

fn check_items(items: &[String]) -> Result<(), String> {
    if items.len() > MAX_ITEMS {
        return Err(too_many(items.len()));
    }
    for (i, item) in items.iter().enumerate() {
        if item.len() > MAX_ITEM {
            return Err(format!(
                "item {i} is {} bytes of JSON; at most {MAX_ITEM} are taken",
                item.len()
            ));
        }
        if item_text(item).contains('\0') {
            return Err(format!("item {i} holds a NUL byte"));
        }
    }
    Ok(())
}

/// An item as `{{item}}` and `DAGCRON_ITEM` give it: a string as it is,
/// anything else as its JSON.
pub fn item_text(json: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::String(s)) => s,
        _ => json.to_string(),
    }
}

/// The task id of instance `index` of mapped task `task`: `task[index]`
/// (a declared task id has no brackets, so the two never meet).
pub fn instance_id(task: &str, index: usize) -> String {
    format!("{task}[{index}]")
}

/// The mapped task and the index of an instance's task id.
pub fn parse_instance(id: &str) -> Option<(&str, usize)> {
    let (task, rest) = id.split_once('[')?;
    let index = rest.strip_suffix(']')?;
    if index.is_empty() || (index.len() > 1 && index.starts_with('0')) {
        return None;
    }
    Some((task, index.parse().ok()?))
}

/// The state a mapped task ends in once all its instances have ended
/// (`states`, none of them unfinished): failed if one failed (or did not
/// run because of a failure), else cancelled if one was, else skipped if
/// all were, else succeeded.
pub fn gathered_state(states: impl IntoIterator<Item = TaskState>) -> TaskState {
    let (mut failed, mut cancelled, mut all_skipped) = (false, false, true);
    for s in states {
        match s {
            TaskState::Failed | TaskState::UpstreamFailed => failed = true,
            TaskState::Cancelled => cancelled = true,
            _ => {}
        }
        all_skipped &= s == TaskState::Skipped;
    }
    if failed {
        TaskState::Failed
    } else if cancelled {
        TaskState::Cancelled
    } else if all_skipped {
        TaskState::Skipped
    } else {
        TaskState::Succeeded
    }
}

/// What a mapped task hands downstream: for each name any of its
/// instances gave, the JSON list of their values in order (a string each,
/// `null` for an instance that gave none), or why it is too much: more
/// than [`crate::outputs::MAX_KEYS`] names, a list longer than
/// [`MAX_GATHERED`], or more than [`MAX_GATHERED_TOTAL`] in all.
pub fn gather<'a>(
    instances: impl ExactSizeIterator<Item = Option<&'a Outputs>>,
) -> Result<Outputs, String> {
    let n = instances.len();
    let mut lists: BTreeMap<&str, Vec<Option<&str>>> = BTreeMap::new();
    for (k, outputs) in instances.enumerate() {
        for (name, value) in outputs.into_iter().flatten() {
            if !lists.contains_key(name.as_str()) && lists.len() == crate::outputs::MAX_KEYS {
                return Err(format!(
                    "the instances' outputs have more than {} names; at most that many are handed downstream",
                    crate::outputs::MAX_KEYS
                ));
            }
            lists.entry(name).or_insert_with(|| vec![None; n])[k] = Some(value);
        }
    }
    let mut out = Outputs::new();
    let mut total = 0;
    for (name, list) in lists {
        let json = serde_json::to_string(&list).expect("strings serialize");
        if json.len() > MAX_GATHERED {
            return Err(format!(
                "the instances' outputs `{name}` make a list of {} bytes; at most {MAX_GATHERED} are handed downstream",
                json.len()
            ));
        }
        total += name.len() + json.len();
        if total > MAX_GATHERED_TOTAL {
            return Err(format!(
                "the instances' outputs make more than {MAX_GATHERED_TOTAL} bytes of lists; at most that many are handed downstream"
            ));
        }
        out.insert(name.to_string(), json);
    }
    Ok(out)
}

fn cut(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(text: &str) -> Result<Source, String> {
        Source::parse(&ForEach::From(text.into()))
    }

    #[test]
    fn sources_are_a_list_an_output_or_a_parameter() {
        assert_eq!(
            Source::parse(&ForEach::Items(vec![
                serde_json::json!("eu"),
                serde_json::json!(3),
                serde_json::json!({"a": 1})
            ])),
            Ok(Source::Items(vec![
                "\"eu\"".into(),
                "3".into(),
                "{\"a\":1}".into()
            ]))
        );
        assert_eq!(
            from(" {{ tasks.list.outputs.parts }} "),
            Ok(Source::Output(Ref {
                task: "list".into(),
                key: "parts".into()
            }))
        );
        assert_eq!(from("{{params.days}}"), Ok(Source::Param("days".into())));
        for bad in [
            "a,b",
            "{{tasks.list.parts}}",
            "x {{params.a}}",
            "{{params.a}}{{params.b}}",
            "{{item}}",
            "{{params.}}",
        ] {
            assert!(
                from(bad).unwrap_err().contains("is not one placeholder"),
                "{bad}"
            );
        }
        let many = ForEach::Items(vec![serde_json::json!(1); MAX_ITEMS + 1]);
        assert!(Source::parse(&many).unwrap_err().contains("1001 items"));
    }

    #[test]
    fn items_come_from_a_json_array_within_the_limits() {
        let params = BTreeMap::from([("days".to_string(), "[\"mon\", 2]".to_string())]);
        let none = |_: &Ref| None;
        assert_eq!(
            Source::Param("days".into()).items(&params, none),
            Ok(vec!["\"mon\"".into(), "2".into()])
        );
        assert!(
            Source::Param("x".into())
                .items(&params, none)
                .unwrap_err()
                .contains("no parameter `x`")
        );
        let r = Source::Output(Ref {
            task: "list".into(),
            key: "parts".into(),
        });
        assert_eq!(r.items(&params, |_| Some("[]".into())), Ok(vec![]));
        let err = |v: &str| r.items(&params, |_| Some(v.into())).unwrap_err();
        assert!(err("a b").contains("output `parts` of task `list`: `a b` is not a JSON array"));
        assert!(err("{\"a\":1}").contains("is not a JSON array"));
        let big = format!("[{}]", vec!["0"; MAX_ITEMS + 1].join(","));
        assert!(err(&big).contains("1001 items; a task expands into at most 1000"));
        let long = format!("[\"{}\"]", "x".repeat(MAX_ITEM));
        assert!(err(&long).contains("item 0 is 8194 bytes"));
        assert!(err(r#"["a", "x\u0000y"]"#).contains("item 1 holds a NUL byte"));
        assert!(
            r.items(&params, |_| Some(r#"[{"a": "\u0000"}]"#.into()))
                .is_ok(),
            "JSON, not a NUL"
        );
        assert!(
            r.items(&params, |_| None)
                .unwrap_err()
                .contains("gave no output `parts`")
        );
    }

    #[test]
    fn instance_ids_read_back_and_strings_are_items_as_they_are() {
        assert_eq!(instance_id("load", 12), "load[12]");
        assert_eq!(parse_instance("load[12]"), Some(("load", 12)));
        assert_eq!(parse_instance("load"), None);
        assert_eq!(parse_instance("load[01]"), None);
        assert_eq!(parse_instance("load[]"), None);
        assert_eq!(parse_instance("load[x]"), None);
        assert_eq!(item_text("\"eu west\""), "eu west");
        assert_eq!(item_text("{\"a\":1}"), "{\"a\":1}");
        assert_eq!(item_text("7"), "7");
    }

    #[test]
    fn instances_add_up_to_one_outcome() {
        use TaskState::*;
        assert_eq!(gathered_state([Succeeded, Skipped]), Succeeded);
        assert_eq!(gathered_state([Skipped, Skipped]), Skipped);
        assert_eq!(gathered_state([Succeeded, Cancelled]), Cancelled);
        assert_eq!(gathered_state([Cancelled, Failed, Succeeded]), Failed);
        assert_eq!(gathered_state([UpstreamFailed]), Failed);
    }

    #[test]
    fn outputs_are_gathered_in_lists_with_nulls_for_the_missing() {
        let a = Outputs::from([("n".into(), "1".into()), ("f".into(), "a b".into())]);
        let b = Outputs::from([("n".into(), "2".into())]);
        let out = gather([Some(&a), None, Some(&b)].into_iter()).unwrap();
        assert_eq!(out["n"], r#"["1",null,"2"]"#);
        assert_eq!(out["f"], r#"["a b",null,null]"#);
        let big = Outputs::from([("f".into(), "x".repeat(MAX_GATHERED / 2))]);
        assert!(
            gather([Some(&big), Some(&big)].into_iter())
                .unwrap_err()
                .contains("at most 98304 are handed downstream")
        );
        assert_eq!(gather([None, None].into_iter()), Ok(Outputs::new()));
        // Names of their own per instance: refused past 64, before any
        // list of a thousand nulls is made.
        let own: Vec<Outputs> = (0..1000)
            .map(|i| (0..64).map(|k| (format!("k{i}_{k}"), "1".into())).collect())
            .collect();
        assert!(
            gather(own.iter().map(Some))
                .unwrap_err()
                .contains("more than 64 names")
        );
        // Lists each within their bound, too much together.
        let wide: Vec<Outputs> = (0..40)
            .map(|_| {
                (0..8)
                    .map(|k| (format!("k{k}"), "x".repeat(1000)))
                    .collect()
            })
            .collect();
        assert!(
            gather(wide.iter().map(Some))
                .unwrap_err()
                .contains("more than 262144 bytes of lists")
        );
    }
}
