//! Reading every job at start-up: pages of the jobs table read on a
//! blocking thread through one read-only connection of its own, without
//! the async driver's hand-off of each row and copy of each value (which
//! took more time than parsing the jobs).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dagcron_store::{Result, StorageError, StoredJob, StoredTimingRow};
use rusqlite::{Connection, OpenFlags, params};

pub(crate) struct BulkReader {
    path: PathBuf,
    conn: Mutex<Option<Connection>>,
}

impl std::fmt::Debug for BulkReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkReader")
            .field("path", &self.path)
            .finish()
    }
}

fn failed(e: rusqlite::Error) -> StorageError {
    StorageError::Unavailable(e.to_string())
}

impl BulkReader {
    pub(crate) fn new(path: &Path) -> BulkReader {
        BulkReader {
            path: path.to_path_buf(),
            conn: Mutex::new(None),
        }
    }

    /// See [`dagcron_store::JobStore::load_jobs`]; blocks.
    pub(crate) fn load_jobs(&self, after: (String, String), limit: u32) -> Result<Vec<StoredJob>> {
        let sql = format!(
            "{} WHERE (j.namespace, j.name) > (?1, ?2) ORDER BY j.namespace, j.name LIMIT ?3",
            crate::SELECT_JOBS
        );
        self.page(&sql, after, limit, |r| StoredJob {
            namespace: r.namespace,
            name: r.name,
            version: r.version,
            spec: r.text,
            paused: r.paused,
            updated_at: r.updated_at,
            rules: r.rules,
            breaker: r.breaker,
        })
    }

    /// See [`dagcron_store::JobStore::load_job_timings`]; blocks. The jobs
    /// table alone: each row's timing fields, not its spec.
    pub(crate) fn load_job_timings(
        &self,
        after: (String, String),
        limit: u32,
    ) -> Result<Vec<StoredTimingRow>> {
        // A row value, so that each page is a range of the primary key.
        let sql = "SELECT namespace, name, version, timing, paused, updated_at, rules, breaker_opened_at, breaker_run, breaker_failures FROM jobs WHERE (namespace, name) > (?1, ?2) ORDER BY namespace, name LIMIT ?3";
        self.page(sql, after, limit, |r| StoredTimingRow {
            namespace: r.namespace,
            name: r.name,
            version: r.version,
            timing: r.text,
            paused: r.paused,
            updated_at: r.updated_at,
            rules: r.rules,
            breaker: r.breaker,
        })
    }

    /// A page of `sql`, whose columns are those of [`Columns`], after `after`.
    fn page<T>(
        &self,
        sql: &str,
        after: (String, String),
        limit: u32,
        make: impl Fn(Columns) -> T,
    ) -> Result<Vec<T>> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let conn = Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(failed)?;
            conn.busy_timeout(std::time::Duration::from_secs(10))
                .map_err(failed)?;
            *guard = Some(conn);
        }
        let conn = guard.as_ref().expect("opened");
        let mut stmt = conn.prepare_cached(sql).map_err(failed)?;
        let mut rows = stmt
            .query(params![after.0, after.1, i64::from(limit)])
            .map_err(failed)?;
        let mut out = Vec::with_capacity(limit as usize);
        // Most jobs were applied under the same rules: their text is
        // parsed once.
        let mut last_rules: Option<(String, dagcron_core::Rules)> = None;
        while let Some(r) = rows.next().map_err(failed)? {
            let rules = match r.get_ref(6).map_err(failed)?.as_str_or_null() {
                Ok(None) => None,
                Ok(Some(text)) => match &last_rules {
                    Some((t, rules)) if t == text => Some(rules.clone()),
                    _ => {
                        let rules = dagcron_store::parse_rules(Some(text))?.expect("some text");
                        last_rules = Some((text.to_string(), rules.clone()));
                        Some(rules)
                    }
                },
                Err(e) => return Err(StorageError::Corrupt(format!("rules: {e}"))),
            };
            out.push(make(Columns {
                namespace: r.get(0).map_err(failed)?,
                name: r.get(1).map_err(failed)?,
                version: r.get(2).map_err(failed)?,
                text: r.get(3).map_err(failed)?,
                paused: r.get::<_, i64>(4).map_err(failed)? != 0,
                updated_at: crate::ts(r.get(5).map_err(failed)?)?,
                rules,
                breaker: dagcron_store::breaker::open_breaker(
                    r.get(7).map_err(failed)?,
                    r.get(8).map_err(failed)?,
                    r.get(9).map_err(failed)?,
                )?,
            }));
        }
        Ok(out)
    }
}

/// The columns of a page of jobs: the fourth is the spec or the timing.
struct Columns {
    namespace: String,
    name: String,
    version: i64,
    text: String,
    paused: bool,
    updated_at: jiff::Timestamp,
    rules: Option<dagcron_core::Rules>,
    breaker: Option<dagcron_core::breaker::OpenBreaker>,
}
