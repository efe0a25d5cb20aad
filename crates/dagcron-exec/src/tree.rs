//! The processes of an attempt, descendants included, found and killed
//! whatever they did to escape.
//!
//! A shell task runs in its own process group, but a descendant may leave it
//! (`setsid`, a daemon's double fork) and keep the output pipes open. Every
//! process an attempt starts inherits a mark in its environment
//! ([`MARK_VAR`]); when the attempt is stopped (or exits with its output
//! still held open), every process that carries the mark is killed, round
//! after round until none is left (a process forking meanwhile is found in
//! the next round). The server (and the agent) is a
//! child subreaper, so that descendants whose parent died are adopted by it
//! rather than by init: it reaps the ones it kills, and sweeps up the
//! zombies of the ones that ended on their own.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// The environment variable that marks every process of an attempt.
pub const MARK_VAR: &str = "DAGCRON_PROCESS_MARK";

/// The processes this executor spawned itself and has not waited for yet:
/// the sweep must never reap them, since their `Child` waits for them.
/// Held while spawning, so that a child cannot be reaped before it is listed.
pub(crate) static SPAWNED: Mutex<Option<HashSet<u32>>> = Mutex::new(None);

/// Makes this process the child subreaper of its descendants (Linux), so
/// that the orphans of the attempts it runs are adopted by it. Returns
/// whether it worked; the processes of an attempt are found by their mark
/// either way.
pub fn become_subreaper() -> bool {
    #[cfg(target_os = "linux")]
    {
        let ok = nix::sys::prctl::set_child_subreaper(true).is_ok();
        SUBREAPER.store(ok, Ordering::SeqCst);
        ok
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Whether this process adopts orphans (only then does it sweep zombies:
/// a process that is not a subreaper has no orphans to reap, and its other
/// children are none of this module's business).
static SUBREAPER: AtomicBool = AtomicBool::new(false);

/// When the last sweep ran, in seconds since the epoch.
static LAST_SWEEP: AtomicU64 = AtomicU64::new(0);

/// Reaps adopted orphans that ended on their own, at most once a second.
pub(crate) fn sweep_adopted() {
    if !SUBREAPER.load(Ordering::SeqCst) {
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST_SWEEP.swap(now, Ordering::SeqCst) != now {
        reap_adopted();
    }
}

/// A mark no other attempt, in this process or another, carries.
pub(crate) fn new_mark() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{started}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Pids of the processes whose environment holds `MARK_VAR=mark`.
fn marked(mark: &str) -> Vec<i32> {
    let needle = format!("{MARK_VAR}={mark}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let me = std::process::id() as i32;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
        })
        .collect()
}

/// The parent of `pid` and whether it is a zombie, from `/proc/PID/stat`.
fn parent_and_zombie(pid: i32) -> Option<(i32, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state == "Z"))
}

/// Kills every process that carries `mark` and reaps those this process
/// adopted. Returns how many it killed. Bounded: a few rounds at most.
pub(crate) fn kill_marked(mark: &str) -> usize {
    let me = std::process::id() as i32;
    let mut killed = 0;
    let mut adopted = Vec::new();
    for _ in 0..16 {
        let found = marked(mark);
        if found.is_empty() {
            break;
        }
        for pid in found {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed += 1;
                if parent_and_zombie(pid).is_some_and(|(ppid, _)| ppid == me) {
                    adopted.push(pid);
                }
            }
        }
    }
    let spawned = SPAWNED.lock().expect("spawned lock");
    for pid in adopted {
        if !spawned.as_ref().is_some_and(|s| s.contains(&(pid as u32))) {
            // Killed with SIGKILL: it is gone or about to be.
            let _ = waitpid(Pid::from_raw(pid), None);
        }
    }
    killed
}

/// Kills every process of the attempts in `attempts` (run, task, number),
/// known by the identity in their environment: processes left running by a
/// server that was killed, found by the next one before it retries them.
/// Returns how many it killed.
pub fn kill_attempts(attempts: &HashSet<(i64, String, u32)>) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let me = std::process::id() as i32;
    let mut killed = 0;
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let var = |name: &str| {
            env.split(|b| *b == 0)
                .find_map(|kv| kv.strip_prefix(name.as_bytes())?.strip_prefix(b"="))
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        if var(MARK_VAR).is_none() {
            continue;
        }
        let key = (|| {
            Some((
                var("DAGCRON_RUN_ID")?.parse().ok()?,
                var("DAGCRON_TASK_ID")?,
                var("DAGCRON_ATTEMPT")?.parse().ok()?,
            ))
        })();
        if key.is_some_and(|k| attempts.contains(&k))
            && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Reaps adopted descendants that ended on their own (they stay zombies
/// otherwise), never a process this executor waits for itself.
fn reap_adopted() {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    let spawned = SPAWNED.lock().expect("spawned lock");
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        if spawned.as_ref().is_some_and(|s| s.contains(&(pid as u32))) {
            continue;
        }
        if parent_and_zombie(pid) == Some((me, true)) {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}
