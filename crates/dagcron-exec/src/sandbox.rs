//! The sandbox of the shell tasks a server runs itself (Linux).
//!
//! A job's author is a tenant, and a shell task is code the tenant wrote:
//! it must not read the server's data directory, key and token files or
//! configuration, nor see the server's or another task's process (whose
//! environment holds secrets). Once [`enable`]d, every shell attempt of
//! this process starts in:
//!
//! - a PID namespace of its own: the task is PID 1 there and sees no
//!   other process (a fresh `/proc` is mounted, so `/proc/$PPID/environ`
//!   and other tasks' `/proc/*/environ` do not exist for it); when it
//!   ends, the kernel kills whatever it left behind;
//! - a mount namespace of its own, where each hidden directory is covered
//!   by an empty read-only tmpfs and each hidden file by `/dev/null`: the
//!   paths still exist, their contents do not;
//! - `no_new_privs`, so that no set-uid program gives back privileges;
//! - when the server runs as root, an unprivileged user (`nobody` unless
//!   the namespace's execution policy names another); otherwise a user
//!   namespace that maps the server's own user to itself, which is what
//!   lets an unprivileged server make the other namespaces.
//!
//! Why mounts rather than Landlock: Landlock grants access to hierarchies
//! and denies the rest, so "everything but the data directory" cannot be
//! said without also denying writes to the directories that contain it
//! (a quick start's data directory sits in the user's working directory).
//! Covering the hidden paths in a private mount namespace takes exactly
//! them away and nothing else.
//!
//! Setting up happens in the child between `fork` and `exec`, where only
//! system calls are safe: everything it needs (paths, the uid and gid
//! maps) is prepared beforehand ([`Prepared`]). The child makes the new
//! namespaces and forks again: its own child becomes PID 1 of the new PID
//! namespace and runs the task, while it waits and ends as that one ends
//! (same exit code, or killed by the same signal), so that the executor
//! sees the task's status. Both are in the attempt's process group.
//!
//! Nothing runs unsandboxed silently: [`enable`] tries the sandbox once;
//! if the kernel refuses a step, every shell attempt fails with the reason
//! ([`refusals`] counts them), and a step refused later fails its attempt
//! with the reason in its output.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The exit status of a task whose sandbox could not be completed after
/// the namespaces were made (the reason is written to its output).
pub const SANDBOX_FAILED: i32 = 126;

/// A user and group the task runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskUser {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

impl TaskUser {
    /// The unprivileged user tasks run as by default when the server is
    /// root: `nobody`, or 65534 where there is no such name.
    pub fn nobody() -> TaskUser {
        TaskUser::lookup("nobody").unwrap_or(TaskUser {
            uid: 65534,
            gid: 65534,
        })
    }

    /// A user by name, or `UID:GID` in numbers. Root is refused: a task
    /// never runs as root.
    pub fn lookup(name: &str) -> Result<TaskUser, String> {
        let user = if let Some((u, g)) = name.split_once(':') {
            let number = |s: &str| {
                s.parse::<u32>()
                    .map_err(|_| format!("{name:?} is neither a user name nor UID:GID"))
            };
            TaskUser {
                uid: number(u)?,
                gid: number(g)?,
            }
        } else {
            match nix::unistd::User::from_name(name) {
                Ok(Some(u)) => TaskUser {
                    uid: u.uid.as_raw(),
                    gid: u.gid.as_raw(),
                },
                Ok(None) => return Err(format!("there is no user {name:?} on this machine")),
                Err(e) => return Err(format!("looking up the user {name:?}: {e}")),
            }
        };
        if user.uid == 0 || user.gid == 0 {
            return Err(format!(
                "{name:?} is root (user or group 0): tasks never run as root"
            ));
        }
        Ok(user)
    }
}

/// What the sandbox hides and whom it runs tasks as.
#[derive(Debug)]
struct Settings {
    /// Paths covered in the task's mount namespace: `(path, is a directory)`.
    hidden: Vec<(CString, bool)>,
    /// The user of tasks when this process is root.
    user: TaskUser,
    /// Why the sandbox cannot be made here, if it cannot.
    unavailable: Option<String>,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

static REFUSALS: AtomicU64 = AtomicU64::new(0);

/// Shell attempts this process refused to run because their sandbox could
/// not be made.
pub fn refusals() -> u64 {
    REFUSALS.load(Ordering::Relaxed)
}

/// Runs every shell task of this process in the sandbox from now on,
/// hiding `hidden` (files or directories; the ones that do not exist are
/// hidden too if they are made later inside a hidden directory, and
/// otherwise skipped) and, when this process is root, running tasks as
/// `user` unless their attempt names another. Tries the sandbox once with
/// `/bin/true`: `Err` says why it cannot be made here (the sandbox stays
/// on, and every shell attempt fails with that reason). Only the first
/// call counts.
pub fn enable(hidden: &[PathBuf], user: TaskUser) -> Result<(), String> {
    let mut covered = Vec::new();
    for path in hidden {
        let Ok(real) = path.canonicalize() else {
            continue;
        };
        let Ok(c) = CString::new(real.as_os_str().as_bytes()) else {
            continue;
        };
        covered.push((c, real.is_dir()));
    }
    covered.sort();
    covered.dedup();
    // What lies inside a hidden directory is hidden with it (and could not
    // be covered on its own: the directory's cover hides it first).
    let dirs: Vec<PathBuf> = covered
        .iter()
        .filter(|(_, is_dir)| *is_dir)
        .map(|(p, _)| PathBuf::from(std::ffi::OsStr::from_bytes(p.as_bytes())))
        .collect();
    covered.retain(|(p, _)| {
        let p = Path::new(std::ffi::OsStr::from_bytes(p.as_bytes()));
        !dirs.iter().any(|d| p != d && p.starts_with(d))
    });
    let mut settings = Settings {
        hidden: covered,
        user,
        unavailable: None,
    };
    settings.unavailable = probe(&settings).err();
    let result = settings.unavailable.clone().map_or(Ok(()), Err);
    let _ = SETTINGS.set(settings);
    result
}

/// Whether shell tasks of this process run in the sandbox.
pub fn enabled() -> bool {
    SETTINGS.get().is_some()
}

#[cfg(target_os = "linux")]
fn probe(settings: &Settings) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let prepared = Prepared::new(settings, None);
    let mut command = std::process::Command::new("/bin/true");
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: `enter` makes only system calls (see its comment).
    unsafe {
        command.pre_exec(move || prepared.enter());
    }
    let out = command
        .output()
        .map_err(|e| format!("the kernel refused to make the task's namespaces: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[cfg(not(target_os = "linux"))]
fn probe(_: &Settings) -> Result<(), String> {
    Err("the sandbox of shell tasks needs Linux".into())
}

/// The sandbox of one attempt, if this process has one: `Err` with the
/// reason if it has one that cannot be made (the attempt must not run).
pub(crate) fn prepare(run_as: Option<TaskUser>) -> Option<Result<Prepared, String>> {
    let settings = SETTINGS.get()?;
    if let Some(why) = &settings.unavailable {
        REFUSALS.fetch_add(1, Ordering::Relaxed);
        return Some(Err(format!(
            "shell tasks run in a sandbox on this server, and it cannot be made here: {why}; the task was not run"
        )));
    }
    Some(Ok(Prepared::new(settings, run_as)))
}

/// Counts an attempt whose sandbox the kernel refused when it started.
pub(crate) fn refused() {
    REFUSALS.fetch_add(1, Ordering::Relaxed);
}

/// Everything the child needs, made before the fork.
pub(crate) struct Prepared {
    /// Not root: the contents of `uid_map` and `gid_map` in a new user namespace.
    maps: Option<(Vec<u8>, Vec<u8>)>,
    /// Root: the user to become.
    become_user: Option<TaskUser>,
    hidden: Vec<(CString, bool)>,
}

impl Prepared {
    fn new(settings: &Settings, run_as: Option<TaskUser>) -> Prepared {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let (maps, become_user) = if uid == 0 {
            (None, Some(run_as.unwrap_or(settings.user)))
        } else {
            (
                Some((
                    format!("{uid} {uid} 1").into_bytes(),
                    format!("{gid} {gid} 1").into_bytes(),
                )),
                None,
            )
        };
        Prepared {
            maps,
            become_user,
            hidden: settings.hidden.clone(),
        }
    }

    /// The user the task runs as, when it is another than this process's.
    pub(crate) fn user(&self) -> Option<TaskUser> {
        self.become_user
    }

    /// Makes `command` start in this sandbox.
    pub(crate) fn install(self, command: &mut tokio::process::Command) {
        // SAFETY: `enter` makes only system calls between fork and exec.
        unsafe {
            command.pre_exec(move || self.enter());
        }
    }

    /// Run in the child after `fork`, before `exec`: only system calls, no
    /// allocation, no lock. Returns in the process that goes on to `exec`
    /// the task (PID 1 of the new PID namespace); the process that forked
    /// it never returns from here.
    #[cfg(target_os = "linux")]
    pub(crate) fn enter(&self) -> std::io::Result<()> {
        use nix::mount::{MsFlags, mount};
        use nix::sched::{CloneFlags, unshare};
        use nix::unistd::{ForkResult, Gid, Uid, fork, setgid, setgroups, setuid};

        let mut flags = CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS;
        if self.maps.is_some() {
            flags |= CloneFlags::CLONE_NEWUSER;
        }
        unshare(flags)?;
        if let Some((uid_map, gid_map)) = &self.maps {
            write_file(c"/proc/self/setgroups", b"deny")?;
            write_file(c"/proc/self/uid_map", uid_map)?;
            write_file(c"/proc/self/gid_map", gid_map)?;
        }
        // SAFETY: the child of this fork only makes system calls until it
        // execs; this process only waits for it and exits.
        match unsafe { fork() }? {
            ForkResult::Parent { child } => relay(child),
            ForkResult::Child => {}
        }
        // PID 1 of the new namespace: it dies with the process that waits
        // for it (killed by the executor with its group).
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
        let none: Option<&std::ffi::CStr> = None;
        check(
            mount(
                none,
                c"/",
                none,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                none,
            ),
            "making the task's mounts private",
        );
        check(
            mount(
                Some(c"proc"),
                c"/proc",
                Some(c"proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                none,
            ),
            "mounting the task's own /proc",
        );
        for (path, is_dir) in &self.hidden {
            let done = if *is_dir {
                mount(
                    Some(c"tmpfs"),
                    path.as_c_str(),
                    Some(c"tmpfs"),
                    MsFlags::MS_RDONLY
                        | MsFlags::MS_NOSUID
                        | MsFlags::MS_NODEV
                        | MsFlags::MS_NOEXEC,
                    Some(c"size=4k,mode=000"),
                )
            } else {
                mount(
                    Some(c"/dev/null"),
                    path.as_c_str(),
                    none,
                    MsFlags::MS_BIND,
                    none,
                )
            };
            check(done, "hiding a file of the server from the task");
        }
        if let Some(user) = self.become_user {
            check(setgroups(&[]), "dropping the server's groups");
            check(
                setgid(Gid::from_raw(user.gid)),
                "changing to the task's group",
            );
            check(
                setuid(Uid::from_raw(user.uid)),
                "changing to the task's user",
            );
        }
        check(nix::sys::prctl::set_no_new_privs(), "setting no_new_privs");
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn enter(&self) -> std::io::Result<()> {
        Err(std::io::Error::other(
            "the sandbox of shell tasks needs Linux",
        ))
    }
}

/// Writes `bytes` to the file at `path` (a system call each: safe after fork).
#[cfg(target_os = "linux")]
fn write_file(path: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: plain system calls on a file descriptor this function owns.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err(error);
        }
    }
    Ok(())
}

/// In the task's PID 1: a step that failed ends it before the task runs,
/// with the reason on its standard error.
#[cfg(target_os = "linux")]
fn check<T>(result: nix::Result<T>, step: &str) {
    if let Err(errno) = result {
        let parts: [&[u8]; 5] = [
            b"dagcron: the task's sandbox could not be made (",
            step.as_bytes(),
            b": ",
            errno.desc().as_bytes(),
            b"); the task was not run\n",
        ];
        for part in parts {
            // SAFETY: a write to standard error, then _exit: both system calls.
            unsafe {
                libc::write(2, part.as_ptr().cast(), part.len());
            }
        }
        // SAFETY: ends the process without running anything of the parent's.
        unsafe { libc::_exit(SANDBOX_FAILED) }
    }
}

/// The process between the executor and the task: waits for the task (PID
/// 1 of the new namespace) and ends the same way.
#[cfg(target_os = "linux")]
fn relay(child: nix::unistd::Pid) -> ! {
    use nix::sys::wait::{WaitStatus, waitpid};
    // The spawning side waits until every copy of its close-on-exec pipe
    // is closed (that is how it learns the exec happened); this process
    // never execs, so it closes its copies (all but the standard streams).
    // SAFETY: system calls on this process's own descriptors.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            for fd in 3..4096 {
                libc::close(fd);
            }
        }
    }
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => unsafe { libc::_exit(code) },
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                // SAFETY: system calls only; the fallback exit is the shell's convention.
                unsafe {
                    libc::signal(signal as i32, libc::SIG_DFL);
                    libc::kill(libc::getpid(), signal as i32);
                    libc::_exit(128 + signal as i32)
                }
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => unsafe { libc::_exit(SANDBOX_FAILED) },
        }
    }
}

/// Whether `path` is one of the sandbox's hidden paths or inside one (for
/// the checks of other executors: a WebAssembly grant or module there is
/// refused whatever the policy says).
pub fn is_hidden(path: &Path) -> bool {
    let Some(settings) = SETTINGS.get() else {
        return false;
    };
    let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    settings
        .hidden
        .iter()
        .any(|(h, _)| real.starts_with(Path::new(std::ffi::OsStr::from_bytes(h.as_bytes()))))
}

/// The hidden paths (for the checks of other executors and for the docs).
pub fn hidden() -> Vec<PathBuf> {
    SETTINGS
        .get()
        .map(|s| {
            s.hidden
                .iter()
                .map(|(h, _)| PathBuf::from(std::ffi::OsStr::from_bytes(h.as_bytes())))
                .collect()
        })
        .unwrap_or_default()
}
