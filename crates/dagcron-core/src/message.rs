//! Runs started by messages: `nats: { subject: orders.created, stream:
//! ORDERS }` makes a run of the job for each message of that subject in
//! that JetStream stream, through a durable consumer of the job's own.
//!
//! A message is acknowledged only once its run is committed, so a crash
//! before makes the server see it again; its key (the `Nats-Msg-Id` the
//! publisher set, or its place in the stream) makes one run of it
//! whatever the redeliveries. The decisions here are pure: checking the
//! spec, the consumer's name, a message's key and its run's parameters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::hook::{MAX_VALUE, check_params, read_params};
use crate::model::ValidationError;

/// The longest payload passed to a run whole (as `nats_payload`).
pub const MAX_PAYLOAD_PARAM: usize = 16 * 1024;

/// A job's `nats`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsTrigger {
    /// The subject (wildcards `*` and `>` allowed).
    pub subject: String,
    /// The JetStream stream that holds the subject's messages (made by
    /// its owner; dagcron makes only its consumer).
    pub stream: String,
    /// Parameters of the run, each read from the JSON payload by a path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

impl NatsTrigger {
    /// Every problem of the trigger, at `at`.
    pub fn check(&self, at: &str) -> Vec<ValidationError> {
        let mut errors = Vec::new();
        let mut err = |path: String, message: String| {
            errors.push(ValidationError {
                path,
                message,
                span: None,
            })
        };
        let tokens_ok = !self.subject.is_empty()
            && self.subject.len() <= 255
            && self
                .subject
                .split('.')
                .all(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_graphic()));
        if !tokens_ok {
            err(
                format!("{at}.subject"),
                format!(
                    "invalid subject {:?}: tokens of printable characters separated by dots, such as orders.created",
                    self.subject
                ),
            );
        }
        if !valid_stream(&self.stream) {
            err(
                format!("{at}.stream"),
                format!(
                    "invalid stream name {:?}: 1-64 letters, digits, '_' or '-'",
                    self.stream
                ),
            );
        }
        errors.extend(check_params(&self.params, at));
        errors
    }

    /// The run's parameters for a message of `subject` with `payload`:
    /// those mapped from a JSON payload, then `nats_subject` and (text of
    /// at most [`MAX_PAYLOAD_PARAM`] bytes) `nats_payload`.
    pub fn params_of(&self, subject: &str, payload: &[u8]) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if !self.params.is_empty()
            && let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload)
        {
            for (name, v) in read_params(&self.params, &value) {
                if v.len() <= MAX_VALUE {
                    out.insert(name.clone(), v);
                }
            }
        }
        out.insert("nats_subject".into(), subject.to_string());
        if payload.len() <= MAX_PAYLOAD_PARAM
            && let Ok(text) = std::str::from_utf8(payload)
        {
            out.insert("nats_payload".into(), text.to_string());
        }
        out
    }
}

/// Whether `name` can be a stream's name here: 1-64 letters, digits, `_`
/// or `-`.
pub fn valid_stream(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The key of the run a message makes: the id its publisher set
/// (`Nats-Msg-Id`), or its sequence in the stream, which counts from the
/// stream's creation (`created`, in microseconds: a stream made again
/// numbers its messages from 1 again).
pub fn message_key(stream: &str, created: i64, msg_id: Option<&str>, sequence: u64) -> String {
    match msg_id.filter(|id| crate::hook::valid_delivery_id(id)) {
        Some(id) => format!("nats:{stream}:id:{id}"),
        None => format!("nats:{stream}@{created}:seq:{sequence}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(subject: &str, stream: &str) -> NatsTrigger {
        NatsTrigger {
            subject: subject.into(),
            stream: stream.into(),
            params: BTreeMap::from([("order".to_string(), "$.id".to_string())]),
        }
    }

    #[test]
    fn bad_subjects_and_streams_are_reported_at_their_paths() {
        assert!(trigger("orders.created", "ORDERS").check("j").is_empty());
        assert!(trigger("orders.*", "ORDERS").check("j").is_empty());
        for bad in ["", "orders..x", "a b", ".x"] {
            assert_eq!(trigger(bad, "S").check("j")[0].path, "j.subject", "{bad:?}");
        }
        for bad in ["", "a.b", "a b", "x*"] {
            assert_eq!(trigger("s", bad).check("j")[0].path, "j.stream", "{bad:?}");
        }
    }

    #[test]
    fn a_message_gives_its_parameters_and_payload() {
        let t = trigger("orders.created", "ORDERS");
        let p = t.params_of("orders.created", br#"{"id": 42}"#);
        assert_eq!(p["order"], "42");
        assert_eq!(p["nats_subject"], "orders.created");
        assert_eq!(p["nats_payload"], r#"{"id": 42}"#);
        let p = t.params_of("orders.created", &[0xff, 0xfe]);
        assert!(!p.contains_key("nats_payload") && !p.contains_key("order"));
        let big = vec![b'x'; MAX_PAYLOAD_PARAM + 1];
        assert!(!t.params_of("s", &big).contains_key("nats_payload"));
    }

    #[test]
    fn keys_name_the_message_once() {
        assert_eq!(message_key("S", 5, Some("m-1"), 7), "nats:S:id:m-1");
        assert_eq!(message_key("S", 5, None, 7), "nats:S@5:seq:7");
        assert_eq!(message_key("S", 5, Some("bad id"), 7), "nats:S@5:seq:7");
        assert_ne!(message_key("S", 6, None, 7), message_key("S", 5, None, 7));
    }
}
