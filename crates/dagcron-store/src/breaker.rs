//! The statements both SQL stores run to apply a change of a job's failure
//! breaker ([`crate::Write::Breaker`]), and what they read back; and the
//! record of an SLA missed ([`crate::Write::SlaMissed`]).
//!
//! Their parameters first appear in the order of their numbers: SQLite
//! numbers `$N` parameters by where they first appear, not by `N`.

use dagcron_core::breaker::OpenBreaker;

use crate::Result;
use crate::rows::ts;

/// A job's columns of its open breaker, as [`open_breaker`] reads them.
pub const COLUMNS: &str = "breaker_opened_at, breaker_run, breaker_failures";

/// Whether the breaker of job (`$1`, `$2`) is open, and the run after
/// which it counts.
pub const STATE: &str = "SELECT breaker_opened_at IS NOT NULL, breaker_from FROM jobs WHERE namespace = $1 AND name = $2";

/// The states of the latest `$4` runs of job (`$1`, `$2`) after run `$3`
/// that ended succeeded or failed, newest first.
pub const LATEST: &str = "SELECT state FROM runs WHERE namespace = $1 AND job = $2 AND id > $3
     AND state IN ('succeeded', 'failed') ORDER BY id DESC LIMIT $4";

/// Opens the breaker of job (`$4`, `$5`) at `$1`, after run `$2` failed
/// and `$3` failures.
pub const OPEN: &str =
    "UPDATE jobs SET breaker_opened_at = $1, breaker_run = $2, breaker_failures = $3
     WHERE namespace = $4 AND name = $5";

/// Closes the breaker of job (`$1`, `$2`): from now on it counts the runs
/// after the job's latest.
pub const CLOSE: &str =
    "UPDATE jobs SET breaker_opened_at = NULL, breaker_run = NULL, breaker_failures = NULL,
     breaker_from = COALESCE((SELECT MAX(id) FROM runs WHERE namespace = $1 AND job = $2), 0)
     WHERE namespace = $1 AND name = $2";

/// An open breaker from [`COLUMNS`] (none: closed).
pub fn open_breaker(
    opened_at: Option<i64>,
    run: Option<i64>,
    failures: Option<i64>,
) -> Result<Option<OpenBreaker>> {
    let (Some(at), Some(run), Some(failures)) = (opened_at, run, failures) else {
        return Ok(None);
    };
    Ok(Some(OpenBreaker {
        opened_at: ts(at)?,
        run,
        failures: u32::try_from(failures).unwrap_or(u32::MAX),
    }))
}

/// Records the SLA miss of the fire of job (`$2`, `$3`) at `$4`, found at
/// `$1`, if it is not recorded yet (see [`crate::Write::SlaMissed`]).
pub const SLA_MISSED: &str = "UPDATE fires SET sla_missed_at = $1
     WHERE namespace = $2 AND job = $3 AND scheduled_at = $4 AND sla_missed_at IS NULL";
