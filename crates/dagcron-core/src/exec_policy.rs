//! Execution policies: what the code of one namespace's jobs may do on the
//! machines that run it. Set per namespace by an instance admin (a tenant
//! never widens its own), checked when a job is applied and again when an
//! attempt starts; the decisions here are pure.
//!
//! A policy says which executors a namespace may use (shell on the server,
//! shell only on agents, http, wasm), where WebAssembly modules may be read
//! from, which host directories and variables their grants may name, which
//! destinations beyond the public internet http tasks may reach, and the
//! user a server-side shell task runs as when the server is root.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::model::{Executor, Task};

/// Where a namespace's shell tasks may run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShellRule {
    /// On the server (in its sandbox) and on agents.
    #[default]
    Server,
    /// Only on remote agents (tasks with `run_on`).
    Agents,
    /// Nowhere.
    None,
}

/// A namespace's execution policy. Every list is an allowance: what is not
/// listed is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecPolicy {
    /// Where shell tasks may run.
    #[serde(default)]
    pub shell: ShellRule,
    /// Whether http tasks are allowed.
    #[serde(default = "yes")]
    pub http: bool,
    /// Whether WebAssembly tasks are allowed.
    #[serde(default = "yes")]
    pub wasm: bool,
    /// Directories (absolute) WebAssembly modules may be read from, with
    /// what is below them. The server's data directory and key files are
    /// never readable, whatever this says.
    #[serde(default = "everywhere")]
    pub wasm_modules: Vec<String>,
    /// Host directories (absolute) a WebAssembly task's `grants.dirs` may
    /// mount, with what is below them, read-only.
    #[serde(default)]
    pub wasm_dirs: Vec<String>,
    /// Host directories a grant may mount with `write: true`.
    #[serde(default)]
    pub wasm_write_dirs: Vec<String>,
    /// Names of the host's variables a task's `grants.env` may pass on.
    #[serde(default)]
    pub wasm_env: Vec<String>,
    /// Destinations an http task may reach beyond public addresses, as
    /// CIDR blocks (`10.0.0.0/8`, `127.0.0.1/32`, `fd00::/8`). Loopback,
    /// private, link-local (cloud metadata included) and the server's own
    /// addresses are refused unless a block here covers them.
    #[serde(default)]
    pub http_allow: Vec<String>,
    /// The NATS JetStream streams the namespace's `nats` triggers may
    /// consume (none by default: the server's NATS credentials are the
    /// operator's, and a stream may hold another tenant's messages).
    #[serde(default)]
    pub nats_streams: Vec<String>,
    /// The user (a name, or `UID:GID`) a shell task runs as on a server
    /// running as root; none: the server's default (`nobody`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<String>,
    /// The namespace's share of a server's pool while several namespaces
    /// wait for it: it takes up to this many slots in its turn (1 to
    /// [`MAX_WEIGHT`]).
    #[serde(default = "one")]
    pub weight: u32,
}

/// The largest weight of a namespace.
pub const MAX_WEIGHT: u32 = 100;

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

fn everywhere() -> Vec<String> {
    vec!["/".into()]
}

impl Default for ExecPolicy {
    /// The instance's default: shell tasks on the server (sandboxed) and on
    /// agents, http tasks to public addresses only, WebAssembly modules read
    /// from anywhere but the server's own files, with no host directory and
    /// no host variable.
    fn default() -> ExecPolicy {
        ExecPolicy {
            shell: ShellRule::Server,
            http: true,
            wasm: true,
            wasm_modules: everywhere(),
            wasm_dirs: vec![],
            wasm_write_dirs: vec![],
            wasm_env: vec![],
            http_allow: vec![],
            nats_streams: vec![],
            run_as: None,
            weight: 1,
        }
    }
}

/// Why a task is refused: the rule it breaks and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Where in the task (`shell`, `wasm.grants.dirs[0]`, ...).
    pub path: String,
    /// The policy's rule (`shell`, `wasm_dirs`, ...).
    pub rule: &'static str,
    /// A sentence.
    pub message: String,
}

/// The most entries one list of a policy holds.
pub const MAX_ENTRIES: usize = 256;

impl ExecPolicy {
    /// Whether the namespace's `nats` triggers may consume `stream`.
    pub fn may_consume(&self, stream: &str) -> bool {
        self.nats_streams.iter().any(|s| s == stream)
    }

    /// Problems with the policy itself (`(field, message)`): paths must be
    /// absolute and clean, blocks valid CIDR, lists bounded.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let dirs = [
            ("wasm_modules", &self.wasm_modules),
            ("wasm_dirs", &self.wasm_dirs),
            ("wasm_write_dirs", &self.wasm_write_dirs),
        ];
        for (field, list) in dirs {
            for (i, dir) in list.iter().enumerate() {
                if !clean_absolute(dir) {
                    out.push((
                        format!("{field}[{i}]"),
                        format!("{dir:?} is not an absolute path without `..`, `.` or `//`"),
                    ));
                }
            }
        }
        for (i, name) in self.wasm_env.iter().enumerate() {
            if name.is_empty() || name.len() > 256 || name.contains(['=', '\0']) {
                out.push((
                    format!("wasm_env[{i}]"),
                    format!("{name:?} is not a variable name"),
                ));
            }
        }
        for (i, block) in self.http_allow.iter().enumerate() {
            if let Err(e) = Cidr::parse(block) {
                out.push((format!("http_allow[{i}]"), e));
            }
        }
        for (i, stream) in self.nats_streams.iter().enumerate() {
            if !crate::message::valid_stream(stream) {
                out.push((
                    format!("nats_streams[{i}]"),
                    format!("{stream:?} is not a stream name (1-64 letters, digits, '_' or '-')"),
                ));
            }
        }
        if let Some(user) = &self.run_as
            && (user.is_empty() || user.len() > 64 || user.contains(['\0', '/']))
        {
            out.push(("run_as".into(), format!("{user:?} is not a user name")));
        }
        if !(1..=MAX_WEIGHT).contains(&self.weight) {
            out.push((
                "weight".into(),
                format!("{} is not a weight from 1 to {MAX_WEIGHT}", self.weight),
            ));
        }
        let lists = [
            ("wasm_modules", self.wasm_modules.len()),
            ("wasm_dirs", self.wasm_dirs.len()),
            ("wasm_write_dirs", self.wasm_write_dirs.len()),
            ("wasm_env", self.wasm_env.len()),
            ("http_allow", self.http_allow.len()),
            ("nats_streams", self.nats_streams.len()),
        ];
        for (field, len) in lists {
            if len > MAX_ENTRIES {
                out.push((
                    field.into(),
                    format!("{len} entries, more than the {MAX_ENTRIES} allowed"),
                ));
            }
        }
        out
    }

    /// Whether this policy lets `task` run, wherever it is placed (on the
    /// server, or on an agent when it has `run_on`); every broken rule.
    pub fn check(&self, task: &Task) -> Vec<Refusal> {
        let mut out = Vec::new();
        let refuse = |path: String, rule: &'static str, message: String| Refusal {
            path,
            rule,
            message,
        };
        match &task.executor {
            Executor::Shell(_) => match (self.shell, task.run_on.is_some()) {
                (ShellRule::None, _) => out.push(refuse(
                    "shell".into(),
                    "shell",
                    "shell tasks are not allowed in this namespace".into(),
                )),
                (ShellRule::Agents, false) => out.push(refuse(
                    "shell".into(),
                    "shell",
                    "shell tasks of this namespace run only on agents: give the task `run_on`"
                        .into(),
                )),
                _ => {}
            },
            Executor::Http(spec) => {
                if !self.http {
                    out.push(refuse(
                        "http".into(),
                        "http",
                        "http tasks are not allowed in this namespace".into(),
                    ));
                } else if let Some(ip) = literal_host(&spec.url)
                    && let Err(why) = self.destination(ip, &[])
                {
                    out.push(refuse("http.url".into(), "http_allow", why));
                }
            }
            Executor::Wasm(spec) => {
                if !self.wasm {
                    out.push(refuse(
                        "wasm".into(),
                        "wasm",
                        "WebAssembly tasks are not allowed in this namespace".into(),
                    ));
                    return out;
                }
                if !within(&spec.module, &self.wasm_modules) {
                    out.push(refuse(
                        "wasm.module".into(),
                        "wasm_modules",
                        format!(
                            "{:?} is outside the directories this namespace may read modules from",
                            spec.module
                        ),
                    ));
                }
                for (i, dir) in spec.grants.dirs.iter().enumerate() {
                    let (allowed, rule) = if dir.write {
                        (&self.wasm_write_dirs, "wasm_write_dirs")
                    } else {
                        (&self.wasm_dirs, "wasm_dirs")
                    };
                    let may = within(&dir.host, allowed)
                        || (!dir.write && within(&dir.host, &self.wasm_write_dirs));
                    if !may {
                        out.push(refuse(
                            format!("wasm.grants.dirs[{i}]"),
                            rule,
                            format!(
                                "this namespace may not mount {:?}{}",
                                dir.host,
                                if dir.write { " for writing" } else { "" }
                            ),
                        ));
                    }
                }
                for (i, name) in spec.grants.env.iter().enumerate() {
                    if !self.wasm_env.contains(name) {
                        out.push(refuse(
                            format!("wasm.grants.env[{i}]"),
                            "wasm_env",
                            format!("this namespace may not read the host's variable {name}"),
                        ));
                    }
                }
            }
            Executor::Noop => {}
        }
        out
    }

    /// Whether an http task may connect to `ip`. Public addresses are
    /// allowed; loopback, private, link-local (cloud metadata), unspecified,
    /// multicast and `own` (the server's listening addresses) only when a
    /// block of `http_allow` covers them.
    ///
    /// (See also [`ExecPolicy::may_consume`] for the streams of `nats`
    /// triggers.)
    pub fn destination(&self, ip: IpAddr, own: &[IpAddr]) -> Result<(), String> {
        let ip = canonical(ip);
        let special = reserved(ip).or_else(|| {
            own.iter()
                .any(|o| canonical(*o) == ip)
                .then_some("one of the server's own addresses")
        });
        let Some(kind) = special else {
            return Ok(());
        };
        let allowed = self
            .http_allow
            .iter()
            .filter_map(|b| Cidr::parse(b).ok())
            .any(|b| b.contains(ip));
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "{ip} is {kind}, which this namespace's http tasks may not reach (the policy's http_allow does not cover it)"
            ))
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// What kind of non-public address `ip` is, if it is one.
fn reserved(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some("a loopback address")
            } else if v4.is_link_local() {
                Some("a link-local address (cloud metadata among them)")
            } else if v4.is_private() || (a == 100 && (64..128).contains(&b)) {
                Some("a private address")
            } else if v4.is_unspecified() || a == 0 {
                Some("an unspecified address")
            } else if v4.is_multicast() || v4.is_broadcast() || a >= 240 {
                Some("a multicast or reserved address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unspecified() {
                Some("an unspecified address")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if first & 0xfe00 == 0xfc00 {
                Some("a private address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if v6 == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254) {
                Some("a cloud metadata address")
            } else {
                None
            }
        }
    }
}

/// The IP address a URL names literally, if it does.
fn literal_host(url: &str) -> Option<IpAddr> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = host.strip_prefix('[') {
        return v6.split(']').next()?.parse().ok();
    }
    let host = host.split(':').next()?;
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// Whether `path` is clean, absolute, and one of `dirs` or below one.
pub fn within(path: &str, dirs: &[String]) -> bool {
    clean_absolute(path)
        && dirs.iter().any(|d| {
            let d = d.trim_end_matches('/');
            path == d || d.is_empty() || path.strip_prefix(d).is_some_and(|r| r.starts_with('/'))
        })
}

/// An absolute path with no `.`, `..` or empty component.
fn clean_absolute(path: &str) -> bool {
    path == "/"
        || (path.starts_with('/')
            && !path.ends_with('/')
            && path[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."))
}

/// A block of addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    base: IpAddr,
    bits: u8,
}

impl Cidr {
    /// `a.b.c.d/n` or `x::y/n` (a bare address is one address).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (text, None),
        };
        let base: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an address block such as 10.0.0.0/8"))?;
        let max = if base.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("{text:?}: the prefix length is from 0 to {max}"))?,
        };
        Ok(Cidr { base, bits })
    }

    /// Whether `ip` is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.base, canonical(ip)) {
            (IpAddr::V4(b), IpAddr::V4(i)) => prefix_eq(&b.octets(), &i.octets(), self.bits),
            (IpAddr::V6(b), IpAddr::V6(i)) => prefix_eq(&b.octets(), &i.octets(), self.bits),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let whole = usize::from(bits / 8);
    let rest = bits % 8;
    a[..whole] == b[..whole]
        && (rest == 0 || {
            let mask = 0xffu8 << (8 - rest);
            a[whole] & mask == b[whole] & mask
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_refuses_loopback_private_and_metadata_and_allows_public() {
        let p = ExecPolicy::default();
        for denied in [
            "127.0.0.1",
            "127.8.9.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::ffff:127.0.0.1",
            "fe80::1",
            "fd00:ec2::254",
            "fc00::1",
        ] {
            assert!(p.destination(ip(denied), &[]).is_err(), "{denied}");
        }
        for allowed in ["93.184.216.34", "2606:4700::1111", "8.8.8.8"] {
            assert!(p.destination(ip(allowed), &[]).is_ok(), "{allowed}");
        }
        assert!(
            p.destination(ip("93.184.216.34"), &[ip("93.184.216.34")])
                .is_err(),
            "the server's own public address"
        );
    }

    #[test]
    fn http_allow_opens_exactly_its_blocks() {
        let p = ExecPolicy {
            http_allow: vec!["10.0.0.0/8".into(), "127.0.0.1".into()],
            ..ExecPolicy::default()
        };
        assert!(p.destination(ip("10.200.0.9"), &[]).is_ok());
        assert!(p.destination(ip("127.0.0.1"), &[]).is_ok());
        assert!(p.destination(ip("::ffff:127.0.0.1"), &[]).is_ok());
        assert!(p.destination(ip("127.0.0.2"), &[]).is_err());
        assert!(p.destination(ip("192.168.0.1"), &[]).is_err());
    }

    #[test]
    fn cidr_parsing() {
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("nonsense").is_err());
        assert!(Cidr::parse("::/0").unwrap().contains(ip("2001:db8::1")));
        assert!(!Cidr::parse("::/0").unwrap().contains(ip("10.0.0.1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("10.0.0.1")));
        assert!(
            Cidr::parse("10.0.0.0/9")
                .unwrap()
                .contains(ip("10.127.255.255"))
        );
        assert!(
            !Cidr::parse("10.0.0.0/9")
                .unwrap()
                .contains(ip("10.128.0.0"))
        );
    }

    #[test]
    fn literal_hosts_of_urls() {
        assert_eq!(literal_host("http://127.0.0.1:9/x"), Some(ip("127.0.0.1")));
        assert_eq!(literal_host("http://u:p@10.0.0.1/"), Some(ip("10.0.0.1")));
        assert_eq!(literal_host("https://[::1]:8443/"), Some(ip("::1")));
        assert_eq!(literal_host("https://example.com/"), None);
    }

    #[test]
    fn paths_within_directories() {
        let dirs = vec!["/srv/data".to_string()];
        assert!(within("/srv/data", &dirs));
        assert!(within("/srv/data/x/y", &dirs));
        assert!(!within("/srv/database", &dirs));
        assert!(!within("/srv/data/../../etc", &dirs), "no way up");
        assert!(!within("srv/data", &dirs), "absolute only");
        assert!(within("/anything", &["/".to_string()]));
        assert!(!within("/", &dirs));
    }

    proptest! {
        /// A path is never within a directory unless the directory is a
        /// prefix of it at a component boundary, and never with `..`.
        #[test]
        fn within_is_a_component_prefix(parts in proptest::collection::vec("[a-z.]{1,3}", 1..5), dir in proptest::collection::vec("[a-z.]{1,3}", 1..3)) {
            let path = format!("/{}", parts.join("/"));
            let d = format!("/{}", dir.join("/"));
            let inside = within(&path, std::slice::from_ref(&d));
            let expected = clean_absolute(&path) && clean_absolute(&d)
                && (path == d || path.starts_with(&format!("{d}/")));
            prop_assert_eq!(inside, expected);
            if parts.iter().any(|p| p == "..") {
                prop_assert!(!inside);
            }
        }

        /// No address in a reserved range passes the default policy, and an
        /// allowance of exactly one address opens that address alone.
        #[test]
        fn the_default_never_lets_a_reserved_address_through(a in any::<u32>(), b in any::<u32>()) {
            let p = ExecPolicy::default();
            let x = IpAddr::V4(Ipv4Addr::from(a));
            prop_assert_eq!(p.destination(x, &[]).is_ok(), reserved(x).is_none());
            let only = ExecPolicy { http_allow: vec![x.to_string()], ..ExecPolicy::default() };
            let y = IpAddr::V4(Ipv4Addr::from(b));
            prop_assert!(only.destination(x, &[]).is_ok());
            prop_assert_eq!(only.destination(y, &[]).is_ok(), y == x || reserved(y).is_none());
        }
    }
}
