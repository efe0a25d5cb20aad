//! Task executors: run one attempt of a task and report how it ended.
//!
//! Every attempt receives its identity (namespace, job, run, task, attempt
//! number, scheduled time, idempotency key) and the run's parameters, as
//! environment variables for shell tasks and `X-Dagcron-*` headers for HTTP
//! tasks (and as the environment of WebAssembly modules); `{{params.name}}`
//! is substituted in commands, URLs and bodies.
//! Timeouts and cancellation reach the work: a shell task's whole process
//! group is killed, an HTTP request is aborted.
//!
//! # How it works
//!
//! Executors. `shell.rs` runs a child in its own process group with capped
//! output; `http.rs` makes one request with `X-Dagcron-*` identity headers.
//! Both receive the attempt's identity and substitute `{{params.x}}` (as one
//! single-quoted word in a string for `/bin/sh -c`). `tree.rs` finds an
//! attempt's processes wherever they went: each carries a mark in its
//! environment (`DAGCRON_PROCESS_MARK`), and when the attempt is stopped (or
//! exits with its output still held open) every marked process is killed,
//! round after round, before the output pipes get their last two seconds
//! (`PIPE_GRACE`). The server and the agent are child
//! subreapers, so orphans of attempts are adopted (and reaped) by them; at
//! start-up the server kills the processes of attempts recorded as running,
//! found by the identity in their environment, before it retries them.
//!
//! **Architecture Invariant:** no process of an attempt outlives the attempt,
//! and no attempt outlives its server (the shutdown grace ends with a kill).
//!
//! `sandbox.rs` is the sandbox of the shell tasks a server runs itself
//! (turned on by the binary's `serve` only): between fork and exec the child
//! makes a PID and a mount namespace (and a user namespace when the server is
//! not root), forks again so that the task is PID 1 there, mounts a fresh
//! `/proc`, covers the server's files (data directory, keys, configuration),
//! drops to an unprivileged user under root and sets `no_new_privs`; the
//! process between waits for the task and ends as it ends. It and
//! `environ.rs` (a secret variable blanked in the memory behind
//! `/proc/self/environ`) are the only modules with `unsafe` code. With an
//! attempt's execution policy (`AttemptContext::policy`, none on an agent),
//! `http.rs` uses a client whose resolver and redirect policy refuse the
//! destinations the policy does not allow, and `wasm.rs` checks modules,
//! directory grants and host variables on their real paths.
//!
//! **Architecture Invariant:** a server-side shell task never runs outside
//! its sandbox: if the kernel cannot make it, the attempt fails with the
//! reason.
//!
//! `wasm.rs` turns an attempt (identity, parameters, secrets, granted host
//! variables, granted hosts resolved) into an invocation of `dagcron-wasm`
//! when the crate's `wasm` feature is on (the binary turns it on by default);
//! without it a WebAssembly task fails and says why.

// Overwrites the values of secret variables in this process's memory.
#[allow(unsafe_code)]
pub mod environ;
mod http;
pub mod mail;
pub mod notify;
mod outputs;
mod quote;
// Drops the program's clean file pages after start-up (`madvise`).
#[allow(unsafe_code)]
pub mod residency;
// The other module with unsafe code: the set-up of a task's sandbox, between
// fork and exec.
#[allow(unsafe_code)]
pub mod sandbox;
mod shell;
pub mod tree;
mod wasm;

pub use http::own_addresses;
pub use shell::PIPE_GRACE;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dagcron_core::exec_policy::ExecPolicy;
use dagcron_core::outputs::Outputs;
use dagcron_core::{Executor, Failure};
use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

/// Who an attempt is: passed to the task so the systems it calls can deduplicate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptContext {
    /// Tenant.
    pub namespace: String,
    /// Job name.
    pub job: String,
    /// Run id.
    pub run_id: i64,
    /// Task id.
    pub task_id: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// The fire instant of the run.
    pub scheduled_at: Timestamp,
    /// The same for every attempt of this task in this run.
    pub idempotency_key: String,
    /// Run parameters.
    pub params: BTreeMap<String, String>,
    /// The values of the secrets the task refers to, by name.
    pub secrets: SecretValues,
    /// The W3C trace context of the attempt, passed to the task so that
    /// its own spans join the run's trace.
    pub trace: Option<TraceHeaders>,
    /// The outputs of the upstream tasks the task reads (see
    /// [`dagcron_core::Task::reads`]), by task id.
    pub outputs: BTreeMap<String, Arc<Outputs>>,
    /// For an instance of a mapped task: its index among its task's
    /// instances and its item (a string as it is, anything else as JSON),
    /// for `{{index}}` and `{{item}}`.
    pub item: Option<(usize, String)>,
    /// The execution policy of the namespace, checked when the attempt
    /// starts (executor, WebAssembly grants, http destinations, the user of
    /// a sandboxed shell task); `None` on an agent, which runs what its
    /// server sent it.
    pub policy: Option<Arc<ExecPolicy>>,
}

/// A W3C trace context as headers: `traceparent` and, if any, `tracestate`
/// (a shell task gets them as `TRACEPARENT` and `TRACESTATE`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    /// `00-<trace id>-<parent span id>-<flags>`.
    pub traceparent: String,
    /// Vendor entries, passed on as they came.
    pub tracestate: Option<String>,
}

impl TraceHeaders {
    /// The headers as `(name, value)` pairs, lowercase names.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![("traceparent", self.traceparent.as_str())];
        if let Some(state) = &self.tracestate {
            out.push(("tracestate", state.as_str()));
        }
        out
    }
}

/// Secret values given to an attempt, by name. Never printed; every value,
/// and its base64 and URL-encoded forms, is replaced by `***` in what the
/// attempt reports ([`SecretValues::redact`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretValues(pub BTreeMap<String, String>);

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// Values shorter than this are not redacted: replacing every `a` of a
/// log would destroy it and hide nothing.
const MIN_REDACTED: usize = 3;

impl SecretValues {
    /// The byte strings to hide: each value, its base64 forms (padded and
    /// not) and its URL-encoded form, longest first.
    fn forms(&self) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        for v in self.0.values().filter(|v| v.len() >= MIN_REDACTED) {
            let b64 = base64(v.as_bytes());
            out.push(v.as_bytes().to_vec());
            // As a JSON string writes it (outputs that are JSON values).
            let json = serde_json::to_string(v).expect("strings serialize");
            out.push(json.as_bytes()[1..json.len() - 1].to_vec());
            out.push(b64.trim_end_matches('=').as_bytes().to_vec());
            out.push(b64.into_bytes());
            out.push(url_encode(v).into_bytes());
        }
        out.sort_by_key(|f| std::cmp::Reverse(f.len()));
        out.dedup();
        out
    }

    /// `bytes` with every secret value (and encoded form) replaced by `***`.
    pub fn redact(&self, bytes: &[u8]) -> Vec<u8> {
        redact_with(&self.forms(), bytes)
    }

    /// [`SecretValues::redact`] for text.
    pub fn redact_str(&self, text: &str) -> String {
        String::from_utf8_lossy(&self.redact(text.as_bytes())).into_owned()
    }

    /// Outputs with every secret value of their values replaced by `***`.
    pub fn redact_outputs(&self, outputs: Outputs) -> Outputs {
        if self.0.is_empty() {
            return outputs;
        }
        let forms = self.forms();
        outputs
            .into_iter()
            .map(|(k, v)| {
                let v = String::from_utf8_lossy(&redact_with(&forms, v.as_bytes())).into_owned();
                (k, v)
            })
            .collect()
    }
}

fn redact_with(forms: &[Vec<u8>], bytes: &[u8]) -> Vec<u8> {
    if forms.is_empty() {
        return bytes.to_vec();
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match forms.iter().find(|f| bytes[i..].starts_with(f)) {
            Some(f) => {
                out.extend_from_slice(b"***");
                i += f.len();
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl AttemptContext {
    /// The idempotency key of a task in a run.
    pub fn idempotency_key_for(namespace: &str, job: &str, run_id: i64, task: &str) -> String {
        format!("{namespace}/{job}/{run_id}/{task}")
    }

    /// The identity as `(name, value)` pairs, names without prefix
    /// (`NAMESPACE`, `JOB`, ..., `PARAM_REGION`).
    pub fn identity(&self) -> Vec<(String, String)> {
        let mut out = vec![
            ("NAMESPACE".to_string(), self.namespace.clone()),
            ("JOB".to_string(), self.job.clone()),
            ("RUN_ID".to_string(), self.run_id.to_string()),
            ("TASK_ID".to_string(), self.task_id.clone()),
            ("ATTEMPT".to_string(), self.attempt.to_string()),
            ("SCHEDULED_AT".to_string(), self.scheduled_at.to_string()),
            ("IDEMPOTENCY_KEY".to_string(), self.idempotency_key.clone()),
        ];
        if let Some((index, _)) = &self.item {
            out.push(("INDEX".to_string(), index.to_string()));
        }
        for (k, v) in &self.params {
            let name: String = k
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            out.push((format!("PARAM_{name}"), v.clone()));
        }
        out
    }

    /// An instance's item as the variable `DAGCRON_ITEM` (shell and
    /// WebAssembly tasks; an http task has it as `{{item}}` only).
    pub fn item_var(&self) -> Option<(&'static str, &str)> {
        self.item
            .as_ref()
            .map(|(_, item)| ("DAGCRON_ITEM", item.as_str()))
    }

    /// The upstream tasks' outputs as `DAGCRON_OUTPUT_<TASK>_<KEY>`
    /// variables.
    pub fn output_vars(&self) -> impl Iterator<Item = (String, &str)> {
        self.outputs.iter().flat_map(|(task, outputs)| {
            outputs
                .iter()
                .map(move |(k, v)| (dagcron_core::outputs::env_name(task, k), v.as_str()))
        })
    }

    /// Replaces `{{params.name}}` with the parameter's value and
    /// `{{tasks.<task>.outputs.<name>}}` with an upstream task's output
    /// (unknown names stay as written).
    pub fn substitute(&self, text: &str) -> String {
        self.substitute_with(text, |piece, out| {
            out.push_str(piece.text());
            Ok(())
        })
        .expect("plain substitution never fails")
    }

    /// [`AttemptContext::substitute`] for a string run by `/bin/sh -c`:
    /// each value is data wherever it stands (see [`quote`]): outside
    /// quotes it becomes one single-quoted word (`x; touch pwned` is the
    /// word `'x; touch pwned'`, never a command), inside quotes, a command
    /// substitution or a here-document it is escaped for them. A value
    /// that would end a here-document early is refused.
    pub fn substitute_shell(&self, text: &str) -> Result<String, String> {
        let mut tracker = quote::Tracker::default();
        self.substitute_with(text, |piece, out| match piece {
            Piece::Text(t) => {
                tracker.feed(t);
                out.push_str(t);
                Ok(())
            }
            Piece::Value(v) => tracker.put(v, out),
        })
    }

    fn substitute_with(
        &self,
        text: &str,
        mut put: impl FnMut(Piece<'_>, &mut String) -> Result<(), String>,
    ) -> Result<String, String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            put(Piece::Text(&rest[..start]), &mut out)?;
            let after = &rest[start + 2..];
            let Some(end) = after.find("}}") else {
                rest = &rest[start..];
                break;
            };
            let key = after[..end].trim();
            let index;
            let value = match key.split_once('.') {
                None if key == "item" => self.item.as_ref().map(|(_, item)| item),
                None if key == "index" => match &self.item {
                    Some((i, _)) => {
                        index = i.to_string();
                        Some(&index)
                    }
                    None => None,
                },
                Some(("params", k)) => self.params.get(k),
                Some(("secrets", k)) => self.secrets.0.get(k),
                Some(("tasks", path)) => path
                    .split_once(".outputs.")
                    .and_then(|(task, k)| self.outputs.get(task).and_then(|o| o.get(k))),
                _ => None,
            };
            match value {
                Some(v) => put(Piece::Value(v), &mut out)?,
                None => put(Piece::Text(&rest[start..start + 2 + end + 2]), &mut out)?,
            }
            rest = &after[end + 2..];
        }
        put(Piece::Text(rest), &mut out)?;
        Ok(out)
    }
}

/// A piece of a text being substituted: written as it is, or a value.
enum Piece<'a> {
    Text(&'a str),
    Value(&'a str),
}

impl Piece<'_> {
    fn text(&self) -> &str {
        match self {
            Piece::Text(t) | Piece::Value(t) => t,
        }
    }
}

/// Names of the server's environment variables that tasks receive besides
/// the basics (see [`inherited_env`]); set once at start-up.
static PASS_ENV: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Lets tasks receive these variables of the server's (or the agent's)
/// environment, such as `HTTP_PROXY`. Only the first call counts.
pub fn pass_env(names: Vec<String>) {
    let _ = PASS_ENV.set(names);
}

/// What a shell task inherits of this process's environment: `PATH` (a
/// default one if unset), `HOME`, `LANG`, `LC_*`, `TZ`, and the variables
/// named by [`pass_env`]. Nothing else: the server's secrets, its agent
/// token and its database URL stay out of tasks.
/// Read once, at the first attempt (after [`pass_env`]): the environment
/// of this process does not change.
pub fn inherited_env() -> &'static [(String, String)] {
    static INHERITED: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    INHERITED.get_or_init(|| {
        let passed = PASS_ENV.get().map(Vec::as_slice).unwrap_or_default();
        let mut out: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| {
                matches!(k.as_str(), "PATH" | "HOME" | "LANG" | "TZ")
                    || k.starts_with("LC_")
                    || passed.iter().any(|p| p == k)
            })
            .collect();
        if !out.iter().any(|(k, _)| k == "PATH") {
            out.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
        }
        out
    })
}

/// Limits that apply to every attempt.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Output kept per attempt; the rest is dropped with a marker.
    pub max_output: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_output: 1 << 20,
        }
    }
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// It did its job.
    Succeeded,
    /// It failed; the failure says how, for the retry policy.
    Failed(Failure),
    /// It ran past its timeout and was stopped.
    TimedOut,
    /// It was cancelled and stopped.
    Cancelled,
}

/// The report of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// How it ended.
    pub ending: Ending,
    /// Process exit code, or HTTP status.
    pub exit_code: Option<i32>,
    /// What went wrong, in a sentence.
    pub error: Option<String>,
    /// Captured output (stdout and stderr interleaved, or the response body), capped.
    pub log: Vec<u8>,
    /// Where each line of `log` came from and when (a shell task's; none
    /// for other kinds).
    pub lines: Vec<dagcron_core::log::LineMark>,
    /// What the task handed downstream (secrets redacted).
    pub outputs: Outputs,
    /// For an attempt asked to start at an instant: how far from it it
    /// started, in microseconds (positive: late).
    pub start_error_us: Option<i64>,
}

impl Outcome {
    /// An attempt that failed before its work started, saying why.
    pub fn not_started(error: String) -> Outcome {
        Outcome {
            outputs: Default::default(),
            ending: Ending::Failed(Failure::Error(error.clone())),
            exit_code: None,
            error: Some(error),
            log: vec![],
            lines: Vec::new(),
            start_error_us: None,
        }
    }
}

/// Runs one attempt of `executor`.
pub async fn run(
    executor: &Executor,
    ctx: &AttemptContext,
    timeout: Option<Duration>,
    cancel: CancellationToken,
    limits: Limits,
) -> Outcome {
    run_live(executor, ctx, timeout, cancel, limits, None).await
}

/// [`run`], with the output also copied to `live` as it comes (for readers
/// who follow a running attempt); `live` is finished when the attempt ends.
pub async fn run_live(
    executor: &Executor,
    ctx: &AttemptContext,
    timeout: Option<Duration>,
    cancel: CancellationToken,
    limits: Limits,
    live: Option<&LiveLog>,
) -> Outcome {
    if let Some(live) = live {
        live.redact_with(ctx.secrets.forms());
    }
    let mut outcome = match executor {
        Executor::Shell(cmd) => shell::run(cmd, ctx, timeout, cancel, limits, live).await,
        Executor::Http(spec) => {
            let outcome = http::run(spec, ctx, timeout, cancel, limits).await;
            if let Some(live) = live {
                live.push(&outcome.log);
            }
            outcome
        }
        Executor::Wasm(spec) => wasm::run(spec, ctx, timeout, cancel, limits, live).await,
        Executor::Noop => Outcome {
            outputs: Default::default(),
            ending: Ending::Succeeded,
            exit_code: None,
            error: None,
            log: vec![],
            lines: Vec::new(),
            start_error_us: None,
        },
    };
    if let Some(live) = live {
        live.finish();
    }
    // Nothing the attempt reports shows a secret given to it.
    if !ctx.secrets.0.is_empty() {
        outcome.log = ctx.secrets.redact(&outcome.log);
        outcome.error = outcome.error.map(|e| ctx.secrets.redact_str(&e));
    }
    outcome
}

/// The output of a running attempt, readable while it grows.
#[derive(Clone, Debug)]
pub struct LiveLog(Arc<LiveInner>);

#[derive(Debug)]
struct LiveInner {
    buf: std::sync::Mutex<Vec<u8>>,
    /// Byte strings replaced by `***` as output comes (secret values).
    redact: std::sync::Mutex<Vec<Vec<u8>>>,
    cap: usize,
    done: std::sync::atomic::AtomicBool,
    changed: tokio::sync::Notify,
}

impl LiveLog {
    /// An empty log keeping at most `cap` bytes.
    pub fn new(cap: usize) -> LiveLog {
        LiveLog(Arc::new(LiveInner {
            buf: std::sync::Mutex::new(Vec::new()),
            redact: std::sync::Mutex::new(Vec::new()),
            cap,
            done: std::sync::atomic::AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        }))
    }

    /// Hides these byte strings in the output pushed from now on (a value
    /// split across two pushes is caught in the stored log, not here).
    pub fn redact_with(&self, forms: Vec<Vec<u8>>) {
        *self.0.redact.lock().expect("live log lock") = forms;
    }

    /// Appends output (beyond the cap, it is dropped).
    pub fn push(&self, bytes: &[u8]) {
        let redacted;
        let bytes = {
            let forms = self.0.redact.lock().expect("live log lock");
            if forms.is_empty() {
                bytes
            } else {
                redacted = redact_with(&forms, bytes);
                &redacted
            }
        };
        {
            let mut buf = self.0.buf.lock().expect("live log lock");
            let room = self.0.cap.saturating_sub(buf.len());
            buf.extend_from_slice(&bytes[..room.min(bytes.len())]);
        }
        self.0.changed.notify_waiters();
    }

    /// The attempt ended: no more output.
    pub fn finish(&self) {
        self.0.done.store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }

    /// The output from byte `offset` on, and whether the attempt has ended.
    pub fn read_from(&self, offset: usize) -> (Vec<u8>, bool) {
        // Read `done` first: output pushed before it was set is then included.
        let done = self.0.done.load(std::sync::atomic::Ordering::SeqCst);
        let buf = self.0.buf.lock().expect("live log lock");
        (
            buf.get(offset..).map(<[u8]>::to_vec).unwrap_or_default(),
            done,
        )
    }

    /// The output for other nodes to show: at most its last `tail` bytes,
    /// redacted over the whole buffer (a secret split between two pushes
    /// is caught here), with how many bytes came before them and whether
    /// the attempt has ended.
    pub fn published(&self, tail: usize) -> (Vec<u8>, u64, bool) {
        let done = self.0.done.load(std::sync::atomic::Ordering::SeqCst);
        let whole = {
            let buf = self.0.buf.lock().expect("live log lock");
            let forms = self.0.redact.lock().expect("live log lock");
            if forms.is_empty() {
                buf.clone()
            } else {
                redact_with(&forms, &buf)
            }
        };
        let from = whole.len().saturating_sub(tail);
        (whole[from..].to_vec(), from as u64, done)
    }

    /// Waits until there is more output or the attempt ends, or `timeout`.
    pub async fn wait(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.0.changed.notified()).await;
    }
}

/// A byte buffer that keeps at most `cap` bytes and says how much it
/// dropped; with the marks of its lines when it is fed by stream.
pub(crate) struct CappedLog {
    buf: Vec<u8>,
    cap: usize,
    dropped: usize,
    marker: dagcron_core::log::Marker,
}

impl CappedLog {
    pub(crate) fn new(cap: usize) -> CappedLog {
        CappedLog {
            buf: Vec::new(),
            cap,
            dropped: 0,
            marker: dagcron_core::log::Marker::default(),
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.buf.len());
        let take = room.min(bytes.len());
        self.buf.extend_from_slice(&bytes[..take]);
        self.dropped += bytes.len() - take;
    }

    /// Takes output read from `stream` now, marking the lines it starts.
    pub(crate) fn push_from(&mut self, bytes: &[u8], stream: dagcron_core::log::Stream) {
        let room = self.cap.saturating_sub(self.buf.len());
        let at = jiff::Timestamp::now().as_microsecond();
        self.marker
            .push(&bytes[..room.min(bytes.len())], stream, at);
        self.push(bytes);
    }

    /// The marks of the lines kept, taking them.
    pub(crate) fn take_marks(&mut self) -> Vec<dagcron_core::log::LineMark> {
        std::mem::take(&mut self.marker).finish()
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        if self.dropped > 0 {
            self.buf.extend_from_slice(
                format!(
                    "\n[dagcron: output truncated, {} more bytes dropped]\n",
                    self.dropped
                )
                .as_bytes(),
            );
        }
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> AttemptContext {
        AttemptContext {
            item: None,
            outputs: Default::default(),
            namespace: "billing".into(),
            job: "nightly".into(),
            run_id: 42,
            task_id: "extract".into(),
            attempt: 2,
            scheduled_at: "2026-01-01T02:30:00Z".parse().unwrap(),
            idempotency_key: "billing/nightly/42/extract".into(),
            params: BTreeMap::from([
                ("region".into(), "cn-east".into()),
                ("dry-run".into(), "1".into()),
            ]),
            secrets: SecretValues::default(),
            trace: None,
            policy: None,
        }
    }

    #[test]
    fn substitution() {
        let c = ctx();
        assert_eq!(
            c.substitute("./x --region {{params.region}} {{ params.dry-run }}"),
            "./x --region cn-east 1"
        );
        assert_eq!(
            c.substitute("{{params.missing}} {{other}} {{unclosed"),
            "{{params.missing}} {{other}} {{unclosed"
        );
    }

    #[test]
    fn shell_substitution_quotes_each_value_as_one_word() {
        let mut c = ctx();
        c.params
            .insert("who".into(), "x; touch pwned 'quoted' $(id)".into());
        assert_eq!(
            c.substitute_shell("echo hello {{params.who}}").unwrap(),
            r"echo hello 'x; touch pwned '\''quoted'\'' $(id)'"
        );
    }

    #[test]
    fn an_instance_gets_its_item_and_index_as_data() {
        let mut c = ctx();
        assert_eq!(
            c.substitute("{{item}} {{index}}"),
            "{{item}} {{index}}",
            "a task that is not mapped has neither"
        );
        assert!(c.item_var().is_none());
        c.item = Some((7, "eu; touch pwned $(id)".into()));
        assert_eq!(
            c.substitute("{{ item }}/{{index}}"),
            "eu; touch pwned $(id)/7"
        );
        assert_eq!(
            c.substitute_shell("load {{item}} --part {{index}}")
                .unwrap(),
            r"load 'eu; touch pwned $(id)' --part '7'"
        );
        assert_eq!(
            c.item_var(),
            Some(("DAGCRON_ITEM", "eu; touch pwned $(id)"))
        );
        assert!(
            c.identity()
                .contains(&("INDEX".to_string(), "7".to_string()))
        );
        assert!(
            !c.identity().iter().any(|(k, _)| k == "ITEM"),
            "not a header"
        );
    }

    #[test]
    fn secrets_are_redacted_in_every_form() {
        let secrets = SecretValues(BTreeMap::from([
            ("k".into(), "s3cr3t/value+x".into()),
            ("short".into(), "ab".into()),
        ]));
        let text = "plain s3cr3t/value+x, base64 czNjcjN0L3ZhbHVlK3g=, url s3cr3t%2Fvalue%2Bx, ab";
        assert_eq!(
            secrets.redact_str(text),
            "plain ***, base64 ***, url ***, ab"
        );
        // As a JSON string writes it: a secret with a quote or a backslash.
        let quoted = SecretValues(BTreeMap::from([("k".into(), r#"pa"ss\word"#.into())]));
        assert_eq!(
            quoted.redact_str(r#"{"dsn": "u:pa\"ss\\word@h"}"#),
            r#"{"dsn": "u:***@h"}"#
        );
        assert_eq!(format!("{secrets:?}"), r#"["k", "short"]"#, "never printed");
        assert_eq!(base64(b"hello"), "aGVsbG8=");
    }

    #[test]
    fn identity_names() {
        let names: Vec<String> = ctx().identity().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            names,
            [
                "NAMESPACE",
                "JOB",
                "RUN_ID",
                "TASK_ID",
                "ATTEMPT",
                "SCHEDULED_AT",
                "IDEMPOTENCY_KEY",
                "PARAM_DRY_RUN",
                "PARAM_REGION"
            ]
        );
    }

    #[test]
    fn capped_log() {
        let mut log = CappedLog::new(4);
        log.push(b"abc");
        log.push(b"defg");
        assert_eq!(
            String::from_utf8(log.finish()).unwrap(),
            "abcd\n[dagcron: output truncated, 3 more bytes dropped]\n"
        );
    }
}
