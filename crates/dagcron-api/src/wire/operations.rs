//! Operating the instance: the read-only mode, and pausing or resuming a
//! namespace's jobs at once.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Whether the instance is read-only, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReadOnlyAnswer {
    /// While on, schedules keep firing and runs go on; applies, edits,
    /// manual triggers and backfills are refused (`503`, code `read_only`).
    pub read_only: bool,
    /// Why, as the operator who turned it on said.
    pub reason: Option<String>,
    /// Since when.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub since: Option<Timestamp>,
    /// Who turned it on (a token's name).
    pub by: Option<String>,
}

/// Turns the read-only mode on or off.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadOnlyBody {
    /// On or off.
    pub read_only: bool,
    /// Why (shown to everyone refused; at most 500 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// What pausing or resuming every job of a namespace changed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BulkPauseAnswer {
    /// Jobs paused (or resumed) now.
    pub changed: u64,
    /// Jobs that were already so.
    pub unchanged: u64,
}

/// A namespace's quotas; each one unset means no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// Jobs the namespace may hold.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000000000)]
    pub max_jobs: Option<u32>,
    /// Schedules one job may have.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000000000)]
    pub max_schedules_per_job: Option<u32>,
    /// Runs of the namespace unfinished at once (pending or running, on
    /// every node) for a manual trigger or a backfill to be accepted.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000000000)]
    pub max_active_runs: Option<u32>,
    /// Manual triggers and backfills per second, per server (a token bucket
    /// that holds one second's worth).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 10000)]
    pub max_triggers_per_second: Option<u32>,
}

/// Where a namespace's shell tasks may run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShellPlace {
    /// On the server (in its sandbox) and on agents.
    #[default]
    Server,
    /// Only on remote agents (tasks with `run_on`).
    Agents,
    /// Nowhere.
    None,
}

/// A namespace's execution policy: what the code of its jobs may do. Set
/// by an instance admin; checked when a job is applied and when each
/// attempt starts. A field left out takes the default shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Where shell tasks may run.
    #[serde(default)]
    pub shell: ShellPlace,
    /// Whether http tasks are allowed.
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub http: bool,
    /// Whether WebAssembly tasks are allowed.
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub wasm: bool,
    /// Directories (absolute) WebAssembly modules may be read from. The
    /// server's data directory and key files never are.
    #[serde(default = "everywhere")]
    #[schema(default = json!(["/"]))]
    pub wasm_modules: Vec<String>,
    /// Host directories a WebAssembly task's grants may mount read-only.
    #[serde(default)]
    pub wasm_dirs: Vec<String>,
    /// Host directories a grant may mount with `write: true`.
    #[serde(default)]
    pub wasm_write_dirs: Vec<String>,
    /// Names of the host's variables a task's grants may pass on.
    #[serde(default)]
    pub wasm_env: Vec<String>,
    /// Address blocks (CIDR) http tasks may reach beyond public addresses:
    /// loopback, private, link-local (cloud metadata) and the server's own
    /// addresses are refused unless a block here covers them.
    #[serde(default)]
    pub http_allow: Vec<String>,
    /// The NATS JetStream streams the namespace's `nats` triggers may
    /// consume (none by default).
    #[serde(default)]
    pub nats_streams: Vec<String>,
    /// The user (a name, or `UID:GID`; never root) shell tasks run as on a
    /// server running as root; none: `nobody`.
    #[serde(default)]
    pub run_as: Option<String>,
    /// The namespace's share of a server's pool while several namespaces
    /// wait for it: up to this many slots in its turn.
    #[serde(default = "one")]
    #[schema(default = 1, minimum = 1, maximum = 100)]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

fn everywhere() -> Vec<String> {
    vec!["/".into()]
}
