//! Checkpoints beside the writer: a thread with a connection of its own
//! copies the log into the database while the writer goes on committing,
//! instead of the commit that crosses SQLite's threshold doing it (a large
//! apply spent a tenth of its time there). The writer keeps a higher
//! threshold of its own, should this thread fall behind.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::Connection;

/// The log's size from which the writer asks for a checkpoint.
const NUDGE_BYTES: u64 = 4 << 20;

pub(crate) struct Checkpointer {
    wal: PathBuf,
    tx: mpsc::SyncSender<()>,
}

impl Checkpointer {
    /// Starts the thread; `None` if it cannot (the writer's own
    /// checkpoints then do the work).
    pub(crate) fn start(path: &Path) -> Option<Checkpointer> {
        let conn = Connection::open(path).ok()?;
        conn.busy_timeout(Duration::from_secs(10)).ok()?;
        let (tx, rx) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("dagcron-sqlite-checkpoint".into())
            .spawn(move || {
                for () in rx {
                    // Passive: never waits for the writer nor blocks it. One
                    // that fails is tried again at the next nudge, and the
                    // writer's own threshold bounds the log meanwhile.
                    let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                }
            })
            .ok()?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        Some(Checkpointer {
            wal: wal.into(),
            tx,
        })
    }

    /// Called after each commit: asks for a checkpoint once the log has grown.
    pub(crate) fn after_commit(&self) {
        if std::fs::metadata(&self.wal).is_ok_and(|m| m.len() >= NUDGE_BYTES) {
            let _ = self.tx.try_send(());
        }
    }
}
