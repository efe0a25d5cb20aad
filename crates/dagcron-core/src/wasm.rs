//! WebAssembly tasks as job files declare them: the module, its inputs,
//! its limits and the capabilities granted to it, and their validation.
//!
//! Everything a module may touch outside its own memory is listed in
//! `grants`; what is not granted is denied.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{EnvValue, ValidationError, secret_placeholders};

/// A WebAssembly task: a WASI preview 1 module or a preview 2 command
/// component, read from the disk of the server (or agent) that runs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WasmSpec {
    /// Absolute path of the module: binary (`.wasm`) or text (`.wat`).
    pub module: String,
    /// The SHA-256 of the file, in hex: an attempt refuses a file that
    /// does not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Arguments after the program name (`{{params.x}}` substituted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables besides the attempt's identity: a value, or
    /// `{ secret: NAME }`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, EnvValue>,
    /// What the module reads on its standard input (default: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// The most linear memory the module may have (default 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// A budget of fuel (about one unit per instruction); none: unmetered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// What the module may reach outside its sandbox.
    #[serde(default, skip_serializing_if = "Grants::is_empty")]
    pub grants: Grants,
}

/// The memory a module gets when its task names none.
pub const DEFAULT_MEMORY: ByteSize = ByteSize(64 << 20);

/// One WebAssembly page: the smallest memory a limit can allow.
const PAGE: u64 = 64 << 10;

/// The largest 32-bit linear memory.
const MAX_MEMORY: u64 = 4 << 30;

impl WasmSpec {
    /// The memory limit in bytes.
    pub fn memory_limit(&self) -> u64 {
        self.memory.unwrap_or(DEFAULT_MEMORY).0
    }
}

/// Capabilities of a WebAssembly task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grants {
    /// Host directories the module sees, each at a path of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<DirGrant>,
    /// Names of the host's environment variables passed to the module.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Hosts (`name` or `name:port`) a component may open TCP connections
    /// to (ports 80 and 443 when none is named).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<String>,
}

impl Grants {
    /// Nothing granted.
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.env.is_empty() && self.http.is_empty()
    }
}

/// A host directory mounted into a module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirGrant {
    /// The directory on the host (absolute).
    pub host: String,
    /// Where the module sees it (absolute, such as `/in`).
    pub guest: String,
    /// Whether the module may create, change and remove files there.
    #[serde(default)]
    pub write: bool,
}

/// Where a module sees the directory of its outputs file
/// (`$DAGCRON_OUTPUTS` is `/dagcron/outputs`); no grant may use it.
pub const OUTPUTS_DIR: &str = "/dagcron";

/// A number of bytes, written `64MiB`, `512KiB`, `1GiB` or as a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses `65536`, `64KiB`, `64MiB`, `1GiB` (also `KB`, `MB`, `GB` as
    /// powers of 1000).
    pub fn parse(text: &str) -> Result<ByteSize, String> {
        let bad = || {
            format!(
                "invalid size {text:?}: write a number of bytes, or a number and a unit (KiB, MiB, GiB, KB, MB, GB), such as 64MiB"
            )
        };
        let digits = text.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = text[..digits].parse().map_err(|_| bad())?;
        let scale: u64 = match text[digits..].trim_start() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            _ => return Err(bad()),
        };
        n.checked_mul(scale).map(ByteSize).ok_or_else(bad)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if n >= scale && n % scale == 0 {
                return write!(f, "{}{unit}", n / scale);
            }
        }
        write!(f, "{n}")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// Whether `name` can be an environment variable's name.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// Whether `host` is `name` or `name:port`, with no scheme or path.
fn valid_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.'));
    name_ok && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

/// Every problem of a WebAssembly task, with its path under `at` (the
/// task's `wasm` field).
pub(crate) fn check(spec: &WasmSpec, at: &str) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    let mut err = |path: String, message: String| {
        errors.push(ValidationError {
            path,
            message,
            span: None,
        })
    };
    let module = &spec.module;
    if !module.starts_with('/') {
        err(
            format!("{at}.module"),
            format!(
                "{module:?} is not an absolute path: name the module's file from the root, such as /srv/tasks/report.wasm"
            ),
        );
    } else if !(module.ends_with(".wasm") || module.ends_with(".wat")) {
        err(
            format!("{at}.module"),
            format!("{module:?} is neither a `.wasm` binary nor a `.wat` text module"),
        );
    }
    if module.contains('\0') || module.split('/').any(|part| part == "..") {
        err(
            format!("{at}.module"),
            "the path may hold neither NUL bytes nor `..`".into(),
        );
    }
    if let Some(sum) = &spec.sha256 {
        if sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
            err(
                format!("{at}.sha256"),
                format!(
                    "{sum:?} is not a SHA-256 digest: write its 64 hex digits (`sha256sum FILE` prints them)"
                ),
            );
        }
    }
    if let Some(memory) = spec.memory {
        if !(PAGE..=MAX_MEMORY).contains(&memory.0) {
            err(
                format!("{at}.memory"),
                format!("{memory} is out of range: a module's memory is 64KiB (one page) to 4GiB"),
            );
        }
    }
    if spec.fuel == Some(0) {
        err(
            format!("{at}.fuel"),
            "a budget of 0 runs nothing: give at least 1, or leave `fuel` out for no budget".into(),
        );
    }
    for (name, value) in &spec.env {
        if !valid_env_name(name) {
            err(
                format!("{at}.env"),
                format!("{name:?} is not an environment variable's name"),
            );
        }
        if let EnvValue::Plain(text) = value {
            if text.contains('\0') {
                err(
                    format!("{at}.env.{name}"),
                    "the value holds a NUL byte, which no environment variable can".into(),
                );
            }
        }
    }
    if spec
        .args
        .iter()
        .any(|a| secret_placeholders(a).next().is_some())
    {
        err(
            format!("{at}.args"),
            "a secret may not be put in the arguments, which are recorded with the task: pass it in `env` (`env: { KEY: { secret: NAME } }`) or `stdin`".into(),
        );
    }
    for (k, dir) in spec.grants.dirs.iter().enumerate() {
        let path = format!("{at}.grants.dirs[{k}]");
        if !dir.host.starts_with('/') {
            err(
                format!("{path}.host"),
                format!("{:?} is not an absolute path", dir.host),
            );
        }
        if !dir.guest.starts_with('/') {
            err(
                format!("{path}.guest"),
                format!(
                    "{:?} is not an absolute path: the module sees the directory there, such as /in",
                    dir.guest
                ),
            );
        }
        if std::path::Path::new(&dir.guest).starts_with(OUTPUTS_DIR) {
            err(
                format!("{path}.guest"),
                format!(
                    "{OUTPUTS_DIR} is where the module finds its outputs file: grant the directory elsewhere"
                ),
            );
        }
        if spec.grants.dirs[..k].iter().any(|d| d.guest == dir.guest) {
            err(
                format!("{path}.guest"),
                format!("{:?} is granted twice", dir.guest),
            );
        }
    }
    for (k, name) in spec.grants.env.iter().enumerate() {
        if !valid_env_name(name) {
            err(
                format!("{at}.grants.env[{k}]"),
                format!("{name:?} is not an environment variable's name"),
            );
        }
    }
    for (k, host) in spec.grants.http.iter().enumerate() {
        if !valid_host(host) {
            err(
                format!("{at}.grants.http[{k}]"),
                format!(
                    "{host:?} is not a host: write its name, or name:port, without scheme or path (api.example.com, api.example.com:8443)"
                ),
            );
        }
    }
    errors
}

/// The secrets a WebAssembly task refers to: in its environment and its
/// standard input.
pub(crate) fn secret_refs(spec: &WasmSpec, out: &mut std::collections::BTreeSet<String>) {
    for v in spec.env.values() {
        match v {
            EnvValue::Plain(t) => out.extend(secret_placeholders(t).map(str::to_string)),
            EnvValue::Secret { secret } => {
                out.insert(secret.clone());
            }
        }
    }
    if let Some(stdin) = &spec.stdin {
        out.extend(secret_placeholders(stdin).map(str::to_string));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(ByteSize::parse("64MiB"), Ok(ByteSize(64 << 20)));
        assert_eq!(ByteSize::parse("65536"), Ok(ByteSize(65536)));
        assert_eq!(ByteSize::parse("2 GB"), Ok(ByteSize(2_000_000_000)));
        assert!(ByteSize::parse("lots").is_err());
        assert!(ByteSize::parse("64mb").is_err());
        assert!(ByteSize::parse("99999999999999999999GiB").is_err());
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }

    #[test]
    fn hosts() {
        assert!(valid_host("api.example.com"));
        assert!(valid_host("api.example.com:8443"));
        assert!(!valid_host("https://api.example.com"));
        assert!(!valid_host("api.example.com/path"));
        assert!(!valid_host("api.example.com:0"));
        assert!(!valid_host(""));
    }
}
