//! The outputs file of a shell attempt (`$DAGCRON_OUTPUTS`), made so that
//! only the attempt can reach it, and read back without trusting what the
//! task left there.
//!
//! Each attempt gets a directory of its own with an unguessable name inside
//! `dagcron-outputs-<uid>` of the temporary directory, which this process
//! owns and which nobody else may list (mode 0711): another task, even one
//! running as the same unprivileged user, cannot find the file to write
//! into it. The attempt's directory and file belong to the user the task
//! runs as. Once the attempt is over, the file is opened without following
//! a symbolic link, and taken only if it is a regular file of that user, at
//! most a bounded number of bytes: a task cannot make the server read
//! another file, a pipe that never ends, or a huge one. The directory is
//! removed when the attempt's [`OutputsFile`] is dropped.

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

impl OutputsFile {
    /// Makes the attempt's directory and empty file, owned by `user` when
    /// the task runs as another user than this process.
    pub(crate) fn make(user: Option<TaskUser>) -> Result<OutputsFile, String> {
        let me = nix::unistd::geteuid().as_raw();
        let base = std::env::temp_dir().join(format!("dagcron-outputs-{me}"));
        let cannot =
            |what: &str, e: std::io::Error| format!("cannot make the outputs file: {what}: {e}");
        match std::fs::DirBuilder::new().mode(0o711).create(&base) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(cannot(&base.display().to_string(), e)),
        }
        // A directory someone else made (or made readable) in its place
        // would let them find the files: refused.
        let meta = std::fs::symlink_metadata(&base).map_err(|e| cannot("its directory", e))?;
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o066 != 0 {
            return Err(format!(
                "cannot make the outputs file: {} is not a directory of this server's user that only it may list",
                base.display()
            ));
        }
        // Others pass through it (a task's user reaches its own directory),
        // whatever the umask made of it.
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| cannot("its directory", e))?;
        let dir = base.join(random_name().map_err(|e| cannot("a random name", e))?);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
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
            for path in [&made.dir, &made.file] {
                std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid))
                    .map_err(|e| cannot("giving it to the task's user", e))?;
            }
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
