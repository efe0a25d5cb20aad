//! The state machines of runs, tasks and attempts. Every change of state is
//! a transition that must be in these tables; storage applies it as a
//! compare-and-set on the previous state, so an illegal or stale change is
//! refused rather than silently applied.

use std::fmt;
use std::str::FromStr;

macro_rules! states {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// Every state.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stored and displayed name.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<$name, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!("unknown {} state {s:?}", stringify!($name))),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

states! {
    /// The state of a run.
    RunState {
        /// Made ahead by a trigger for an instant (`at`); waits for it.
        Planned = "planned",
        /// Created, not started (queued behind `max_active_runs`).
        Pending = "pending",
        /// Tasks are being planned and executed.
        Running = "running",
        /// Every task succeeded or was skipped.
        Succeeded = "succeeded",
        /// A task failed (or the deadline passed).
        Failed = "failed",
        /// Cancelled by a user, a `replace` policy or shutdown.
        Cancelled = "cancelled",
        /// Declined by a policy before starting (recorded with the reason).
        Skipped = "skipped",
    }
}

states! {
    /// The state of a task within a run.
    TaskState {
        /// Waiting for its upstream tasks.
        Pending = "pending",
        /// May start: waiting for a worker.
        Ready = "ready",
        /// An attempt is being handed to a worker.
        Dispatching = "dispatching",
        /// An attempt is running.
        Running = "running",
        /// Waiting out a backoff before the next attempt.
        Retrying = "retrying",
        /// Its retries are exhausted and it has `on_exhausted: hold`: it
        /// waits for an operator to retry it, mark it or fail it.
        Held = "held",
        /// Finished well.
        Succeeded = "succeeded",
        /// Its last attempt failed.
        Failed = "failed",
        /// An upstream task failed, so it will not run.
        UpstreamFailed = "upstream_failed",
        /// Its trigger rule declined it.
        Skipped = "skipped",
        /// The run was cancelled before it finished.
        Cancelled = "cancelled",
    }
}

states! {
    /// The state of one attempt of one task.
    AttemptState {
        /// Being handed to a worker.
        Dispatching = "dispatching",
        /// Executing.
        Running = "running",
        /// Finished well.
        Succeeded = "succeeded",
        /// Finished with an exit code of its task's `skip_on_exit_code`:
        /// its task is skipped.
        Skipped = "skipped",
        /// Finished badly.
        Failed = "failed",
        /// Ran past its timeout and was killed.
        TimedOut = "timed_out",
        /// Its worker or node vanished.
        Lost = "lost",
        /// Cancelled.
        Cancelled = "cancelled",
    }
}

/// A transition that is not in the state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IllegalTransition {
    /// Which machine.
    pub machine: &'static str,
    /// From.
    pub from: &'static str,
    /// To.
    pub to: &'static str,
}

impl fmt::Display for IllegalTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "illegal {} transition {} -> {}",
            self.machine, self.from, self.to
        )
    }
}

impl std::error::Error for IllegalTransition {}

impl RunState {
    /// Whether the run is over.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Succeeded | RunState::Failed | RunState::Cancelled | RunState::Skipped
        )
    }

    /// Checks a transition.
    pub fn to(self, next: RunState) -> Result<RunState, IllegalTransition> {
        use RunState::*;
        let ok = matches!(
            (self, next),
            (Planned, Pending | Running | Cancelled | Skipped)
                | (Pending, Running | Cancelled | Skipped)
                | (Running, Succeeded | Failed | Cancelled)
        );
        if ok {
            Ok(next)
        } else {
            Err(IllegalTransition {
                machine: "run",
                from: self.as_str(),
                to: next.as_str(),
            })
        }
    }
}

impl TaskState {
    /// Whether the task is over.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded
                | TaskState::Failed
                | TaskState::UpstreamFailed
                | TaskState::Skipped
                | TaskState::Cancelled
        )
    }

    /// Checks a transition.
    pub fn to(self, next: TaskState) -> Result<TaskState, IllegalTransition> {
        use TaskState::*;
        let ok = match (self, next) {
            (Pending, Ready | UpstreamFailed | Skipped | Cancelled) => true,
            (Ready, Dispatching | Cancelled) => true,
            // A mapped task (`for_each`): its instances start, or it has
            // none to run (no items, or a list it cannot take).
            (Ready, Running | Skipped | Failed) => true,
            (Dispatching, Running | Retrying | Failed | Cancelled) => true,
            (Running, Succeeded | Failed | Retrying | Cancelled | Skipped) => true,
            (Retrying, Ready | Cancelled) => true,
            // Retries exhausted under `on_exhausted: hold`, and what an
            // operator does with a held task (or a run stopping does).
            (Dispatching | Running, Held) => true,
            (Held, Ready | Succeeded | Skipped | Failed | Cancelled) => true,
            // Marked by an operator while its run goes on.
            (Failed | UpstreamFailed, Succeeded | Skipped) => true,
            // Re-running a finished run from its failed tasks.
            (Failed | UpstreamFailed | Cancelled, Pending) => true,
            _ => false,
        };
        if ok {
            Ok(next)
        } else {
            Err(IllegalTransition {
                machine: "task",
                from: self.as_str(),
                to: next.as_str(),
            })
        }
    }
}

impl AttemptState {
    /// Whether the attempt is over.
    pub fn is_terminal(self) -> bool {
        !matches!(self, AttemptState::Dispatching | AttemptState::Running)
    }

    /// Checks a transition.
    pub fn to(self, next: AttemptState) -> Result<AttemptState, IllegalTransition> {
        use AttemptState::*;
        let ok = matches!(
            (self, next),
            (Dispatching, Running | Failed | Lost | Cancelled)
                | (
                    Running,
                    Succeeded | Skipped | Failed | TimedOut | Lost | Cancelled
                )
        );
        if ok {
            Ok(next)
        } else {
            Err(IllegalTransition {
                machine: "attempt",
                from: self.as_str(),
                to: next.as_str(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the whole transition table of each machine.
    #[test]
    fn transition_tables() {
        fn table<S: Copy + fmt::Display>(all: &[S], to: impl Fn(S, S) -> bool) -> String {
            let mut out = String::new();
            for &a in all {
                let nexts: Vec<String> = all
                    .iter()
                    .filter(|&&b| to(a, b))
                    .map(|b| b.to_string())
                    .collect();
                out.push_str(&format!("{a} -> {}\n", nexts.join(", ")));
            }
            out
        }
        expect_test::expect![[r#"
            planned -> pending, running, cancelled, skipped
            pending -> running, cancelled, skipped
            running -> succeeded, failed, cancelled
            succeeded -> 
            failed -> 
            cancelled -> 
            skipped -> 
        "#]]
        .assert_eq(&table(RunState::ALL, |a, b| a.to(b).is_ok()));
        expect_test::expect![[r#"
            pending -> ready, upstream_failed, skipped, cancelled
            ready -> dispatching, running, failed, skipped, cancelled
            dispatching -> running, retrying, held, failed, cancelled
            running -> retrying, held, succeeded, failed, skipped, cancelled
            retrying -> ready, cancelled
            held -> ready, succeeded, failed, skipped, cancelled
            succeeded -> 
            failed -> pending, succeeded, skipped
            upstream_failed -> pending, succeeded, skipped
            skipped -> 
            cancelled -> pending
        "#]]
        .assert_eq(&table(TaskState::ALL, |a, b| a.to(b).is_ok()));
        expect_test::expect![[r#"
            dispatching -> running, failed, lost, cancelled
            running -> succeeded, skipped, failed, timed_out, lost, cancelled
            succeeded -> 
            skipped -> 
            failed -> 
            timed_out -> 
            lost -> 
            cancelled -> 
        "#]]
        .assert_eq(&table(AttemptState::ALL, |a, b| a.to(b).is_ok()));
    }

    #[test]
    fn terminal_states_have_no_way_out_except_rerun() {
        for s in AttemptState::ALL {
            if s.is_terminal() {
                assert!(AttemptState::ALL.iter().all(|n| s.to(*n).is_err()));
            }
        }
        assert_eq!(
            RunState::Succeeded
                .to(RunState::Running)
                .unwrap_err()
                .to_string(),
            "illegal run transition succeeded -> running"
        );
        for s in TaskState::ALL {
            assert_eq!(s.as_str().parse::<TaskState>().unwrap(), *s);
        }
    }
}
