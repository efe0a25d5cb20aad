//! The outputs file of a shell or WebAssembly attempt (`$DAGCRON_OUTPUTS`),
//! made so that only the attempt can reach it, and read back without
//! trusting what the task left there.
//!
//! This process keeps the files in a directory of the temporary directory
//! with a random name, made once (nobody can take its place ahead of it),
//! which others pass through but cannot list (mode 0711). Each attempt gets
//! a directory there with an unguessable name, this process's and as
//! closed (the task can neither list it nor create, link or replace
//! anything in it), holding one file that belongs to the user the task
//! runs as: another task, even one running as the same unprivileged user,
//! cannot find a file to write into. Once the attempt is over, the file is
//! opened without following a symbolic link, and taken only if it is a
//! regular file of that user, at most a bounded number of bytes. The
//! directory is removed when the attempt's [`OutputsFile`] is dropped.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use dagcron_core::outputs::{self, Outputs};

use crate::sandbox::TaskUser;

/// The name of the variable a task finds the file's path in.
pub(crate) const VAR: &str = "DAGCRON_OUTPUTS";

const REPLACED: &str =
    "the task's outputs file was replaced by something other than a regular file of its own";

/// One attempt's outputs file.
pub(crate) struct OutputsFile {
    dir: PathBuf,
    file: PathBuf,
    owner: u32,
}

/// This process's directory of outputs files: made once, with a random
/// name (nobody can take its place ahead of it), mode 0711 (others pass
/// through it but cannot list it).
pub(crate) fn base() -> Result<&'static Path, String> {
    static BASE: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let cannot = |e: std::io::Error| format!("cannot make the directory of outputs files: {e}");
        let base = std::env::temp_dir().join(format!(
            "dagcron-outputs-{}",
            random_name().map_err(cannot)?
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&base)
            .map_err(cannot)?;
        // Whatever the umask made of it.
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711)).map_err(cannot)?;
        Ok(base)
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(Clone::clone)
}

impl OutputsFile {
    /// Makes the attempt's directory (this process's, mode 0711: the task
    /// can neither list it nor put anything else in it) and its empty file,
    /// owned by `user` when the task runs as another user than this process.
    pub(crate) fn make(user: Option<TaskUser>) -> Result<OutputsFile, String> {
        let me = nix::unistd::geteuid().as_raw();
        let cannot =
            |what: &str, e: std::io::Error| format!("cannot make the outputs file: {what}: {e}");
        let dir = base()?.join(random_name().map_err(|e| cannot("a random name", e))?);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| cannot("the attempt's directory", e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| cannot("the attempt's directory", e))?;
        let made = OutputsFile {
            file: dir.join("outputs"),
            dir,
            owner: user.map_or(me, |u| u.uid),
        };
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&made.file)
            .map_err(|e| cannot("the file", e))?;
        if let Some(user) = user {
            std::os::unix::fs::chown(&made.file, Some(user.uid), Some(user.gid))
                .map_err(|e| cannot("giving it to the task's user", e))?;
        }
        Ok(made)
    }

    /// The file's path, for the task.
    pub(crate) fn path(&self) -> &Path {
        &self.file
    }

    /// The attempt's directory that holds the file.
    #[cfg_attr(not(feature = "wasm"), allow(dead_code))]
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the task wrote: nothing if the file is gone, an error if it is
    /// not a regular file of the task's user or its content is refused.
    pub(crate) fn read(&self) -> Result<Outputs, String> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.file)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Outputs::new()),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(REPLACED.into()),
            Err(e) => return Err(format!("the task's outputs file cannot be read: {e}")),
        };
        let meta = file
            .metadata()
            .map_err(|e| format!("the task's outputs file cannot be read: {e}"))?;
        if !meta.is_file() || meta.uid() != self.owner {
            return Err(REPLACED.into());
        }
        let mut bytes = Vec::new();
        file.take(outputs::MAX_TOTAL as u64 * 2 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("the task's outputs file cannot be read: {e}"))?;
        outputs::parse(&bytes).map_err(|e| e.to_string())
    }
}

impl Drop for OutputsFile {
    fn drop(&mut self) {
        // `remove_dir_all` does not follow symbolic links the task made.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 128 random bits in hex.
fn random_name() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
