//! The timer queue: fires (read ahead of time when their job is not in
//! memory), retries and deadlines, and fires overdue after a clock step.

use std::collections::BTreeMap;

use super::*;

/// The engine's timers part: one queue over every schedule, retry and
/// deadline, and what the loop remembers of its wake-ups.
pub(super) struct Timers {
    pub(super) queue: TimerQueue,
    /// The instant whose fires were last warmed up ([`Engine::warm_up`]).
    pub(super) warmed: Option<Timestamp>,
    /// The latest time a timer wake-up saw, to notice a clock stepping back.
    pub(super) last_wake: Timestamp,
}

impl Timers {
    /// An empty queue, woken last at `now`.
    pub(super) fn at(now: Timestamp) -> Timers {
        Timers {
            queue: TimerQueue::default(),
            warmed: None,
            last_wake: now,
        }
    }
}

/// Timers by instant, those of one instant in the order they were armed.
///
/// Many schedules share their instants (every job due at the top of a
/// minute or an hour): one entry per instant keeps the fires of an instant
/// together, so that taking the next one is a look at the first entry, not
/// a walk down a heap of every timer (a cache miss per level at a million
/// schedules). An instant with one timer holds it inline.
#[derive(Default)]
pub(super) struct TimerQueue {
    by_instant: BTreeMap<Timestamp, Bucket>,
}

enum Bucket {
    One(Timer),
    Many(VecDeque<Timer>),
}

impl TimerQueue {
    pub(super) fn push(&mut self, at: Timestamp, timer: Timer) {
        use std::collections::btree_map::Entry;
        match self.by_instant.entry(at) {
            Entry::Vacant(v) => {
                v.insert(Bucket::One(timer));
            }
            Entry::Occupied(mut o) => {
                let bucket = o.get_mut();
                if let Bucket::Many(timers) = bucket {
                    timers.push_back(timer);
                } else if let Bucket::One(first) =
                    std::mem::replace(bucket, Bucket::Many(VecDeque::new()))
                {
                    *bucket = Bucket::Many(VecDeque::from([first, timer]));
                }
            }
        }
    }

    /// Calls `f` with each timer of the earliest instant, in arming order.
    pub(super) fn for_each_first(&self, mut f: impl FnMut(&Timer)) {
        match self.by_instant.first_key_value() {
            Some((_, Bucket::One(timer))) => f(timer),
            Some((_, Bucket::Many(timers))) => timers.iter().for_each(f),
            None => {}
        }
    }

    /// How many timers the earliest instant has.
    pub(super) fn first_len(&self) -> usize {
        match self.by_instant.first_key_value() {
            Some((_, Bucket::One(_))) => 1,
            Some((_, Bucket::Many(timers))) => timers.len(),
            None => 0,
        }
    }

    /// The instant of the earliest timer.
    pub(super) fn next_at(&self) -> Option<Timestamp> {
        self.by_instant.first_key_value().map(|(at, _)| *at)
    }

    /// Takes the earliest timer if it is due at `now`.
    pub(super) fn pop_due(&mut self, now: Timestamp) -> Option<Timer> {
        let mut first = self.by_instant.first_entry()?;
        if *first.key() > now {
            return None;
        }
        match first.get_mut() {
            Bucket::Many(timers) if timers.len() > 1 => timers.pop_front(),
            _ => match first.remove() {
                Bucket::One(timer) => Some(timer),
                Bucket::Many(mut timers) => timers.pop_front(),
            },
        }
    }
}

/// An instant with at least this many timers is warmed up before it comes.
pub(super) const WARM_UP_FIRES: usize = 16;

/// How long before such an instant the loop wakes to warm it up.
pub(super) const WARM_UP_AHEAD: SignedDuration = SignedDuration::from_millis(2);

impl<S: Store> Engine<S> {
    /// Makes the fire of `namespace/job` at `at`, which the store refused
    /// as made before its instant by its clock, again a little later: after
    /// as long as this node's clock is measured ahead, and at least 100 ms.
    pub(super) fn refire(&mut self, namespace: &str, job: &str, at: Timestamp, now: Timestamp) {
        let key = (namespace.to_string(), job.to_string());
        let Some((key, entry)) = self.jobs.table.get_key_value(&key) else {
            return;
        };
        let (key, generation) = (key.clone(), entry.generation);
        let wait = self
            .ahead_of_database()
            .max(SignedDuration::from_millis(100));
        self.arm(
            now.checked_add(wait).unwrap_or(now),
            Timer::Refire {
                key,
                generation,
                at,
            },
        );
    }

    /// The job of a fire timer of `generation`, if the timer is current
    /// and the job not paused.
    fn firing(&self, key: &JobKey, generation: u64) -> Option<&JobEntry> {
        self.jobs
            .table
            .get(key)
            .filter(|e| e.generation == generation && !e.paused)
            .map(|e| &**e)
    }

    /// How far this node's clock is ahead of the database's, as last
    /// measured (zero outside a cluster).
    fn ahead_of_database(&self) -> SignedDuration {
        self.config.node.as_ref().map_or(SignedDuration::ZERO, |n| {
            SignedDuration::from_micros(n.ahead_us.load(std::sync::atomic::Ordering::Relaxed))
        })
    }

    pub(super) fn arm(&mut self, at: Timestamp, timer: Timer) {
        self.timers.queue.push(at, timer);
    }

    /// The instant to wake at before `next` to warm its fires up (see
    /// [`Engine::warm_up`]), if it has enough of them and is far enough.
    pub(super) fn warm_up_at(&self, next: Option<Timestamp>) -> Option<Timestamp> {
        let next = next.filter(|at| {
            self.timers.warmed != Some(*at) && self.timers.queue.first_len() >= WARM_UP_FIRES
        })?;
        let wake = next.checked_sub(WARM_UP_AHEAD).ok()?;
        (wake > self.clock.now()).then_some(wake)
    }

    /// Reads ahead what the fires of the earliest instant, `at`, will read
    /// when it comes: their jobs' entries, keys and specs. They were last
    /// touched when each fire was armed (half a second to an hour ago) and
    /// have left the processor's caches since; at a million jobs, every
    /// look at one costs cache and TLB misses, and the fires of an instant
    /// are handled one after another, so the last of them would wait for
    /// all those misses. Nothing is decided here.
    pub(super) fn warm_up(&mut self, at: Timestamp) {
        self.timers.warmed = Some(at);
        let (jobs, mut fires) = (&self.jobs.table, 0);
        self.timers.queue.for_each_first(|timer| {
            let Timer::Fire { key, .. } = timer else {
                return;
            };
            let Some(entry) = jobs.get(&**key) else {
                return;
            };
            fires += 1;
            std::hint::black_box((entry.generation, entry.active.len(), entry.queued.len()));
            if let Some(job) = &entry.job {
                std::hint::black_box(job.spec.max_pending());
                for task in &job.tasks {
                    std::hint::black_box(task.id.as_bytes().first().copied());
                }
            }
        });
        // Room for their runs and writes, made now rather than by a
        // growing table in the middle of the instant.
        self.runs.table.reserve(fires);
        self.batch.writes.reserve(4 * fires);
    }

    /// Whether a fire timer armed at `generation` still stands.
    pub(super) fn current(&self, key: &JobKey, generation: u64) -> bool {
        self.jobs
            .table
            .get(key)
            .is_some_and(|e| e.generation == generation && !e.paused)
    }

    pub(super) fn on_timers(&mut self) {
        let now = self.clock.now();
        if now.duration_since(self.timers.last_wake) < SignedDuration::from_secs(-1) {
            tracing::warn!(
                "the clock stepped back by {:.1}s; no instant fires twice: fires wait until the clock is past the last one",
                self.timers.last_wake.duration_since(now).as_secs_f64()
            );
        }
        self.timers.last_wake = self.timers.last_wake.max(now);
        // Fires whose job must be read first: those prepared ahead, and
        // any due without its job in memory.
        let mut to_read = Vec::new();
        // The next fires of the jobs that fired, armed once every timer due
        // is handled: the fires of one instant come first, the bookkeeping
        // for the next ones after them.
        let mut fired = Vec::new();
        while let Some(timer) = self.timers.queue.pop_due(now) {
            match timer {
                Timer::Prepare {
                    key,
                    generation,
                    at,
                } => {
                    if self.current(&key, generation) {
                        to_read.push((key, generation, at));
                    }
                }
                Timer::Fire {
                    key,
                    generation,
                    at,
                } => {
                    // One look at the job for what the fire needs: at a
                    // million jobs, each look costs cache misses.
                    let Some(entry) = self.firing(&key, generation) else {
                        continue;
                    };
                    // A node whose clock is ahead of the database's waits
                    // until the fire is due by the database's clock too.
                    let ahead = self.ahead_of_database();
                    let handle = fires::handle_at(&entry.timing, at);
                    if ahead.is_positive() && now.duration_since(handle) < ahead {
                        let later = handle.checked_add(ahead).unwrap_or(handle);
                        self.arm(
                            later,
                            Timer::Fire {
                                key,
                                generation,
                                at,
                            },
                        );
                        continue;
                    }
                    // Ordinary delays (a busy loop, a slow commit) never
                    // count: at least RUNNING_GRACE_FLOOR.
                    let grace = self.config.misfire_grace.max(RUNNING_GRACE_FLOOR);
                    // A jittered fire is due at its delayed instant.
                    let due = fires::jittered(&entry.timing, at);
                    let excluded = entry.timing.excluded_by(at).map(str::to_string);
                    let job = entry.job.clone();
                    if now.duration_since(due)
                        > SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX)
                    {
                        // The process was suspended or the wall clock
                        // stepped forward: as after downtime, the fires
                        // overdue by more than the grace follow the
                        // misfire policy instead of firing in a burst.
                        tracing::warn!(
                            job = %format!("{}/{}", key.0, key.1),
                            "fire of {at} is {:.1}s overdue (was the process suspended, or did the clock step forward?); handling the missed fires by the misfire policy",
                            now.duration_since(at).as_secs_f64()
                        );
                        let since = at.checked_sub(SignedDuration::from_nanos(1)).unwrap_or(at);
                        self.catch_up_beside(&key, since, now, grace);
                        continue;
                    }
                    if let Some(calendar) = excluded {
                        // Suppressed by an exclusion calendar: recorded
                        // with its name, and no run.
                        self.record_suppressed(&key, at, &calendar);
                        fired.push((key, at));
                        continue;
                    }
                    let Some(job) = job else {
                        to_read.push((key, generation, at));
                        continue;
                    };
                    self.fire(&key, &job, at, Trigger::Schedule, FireOutcome::Fired);
                    fired.push((key, at));
                }
                Timer::Refire {
                    key,
                    generation,
                    at,
                } => {
                    let Some(entry) = self.firing(&key, generation) else {
                        continue;
                    };
                    if let Some(calendar) = entry.timing.excluded_by(at).map(str::to_string) {
                        self.record_suppressed(&key, at, &calendar);
                        continue;
                    }
                    match entry.job.clone() {
                        Some(job) => {
                            self.fire(&key, &job, at, Trigger::Schedule, FireOutcome::Fired)
                        }
                        None => {
                            tracing::warn!(job = %format!("{}/{}", key.0, key.1), "fire of {at} refused as early could not be made again: its job is not in memory")
                        }
                    }
                }
                Timer::Paced => {
                    self.runs.pace.armed = false;
                    self.paced(now);
                }
                Timer::Retry { run, task } => {
                    self.step(run, Event::RetryDue { task }, now, None);
                }
                Timer::CatchUp {
                    key,
                    generation,
                    since,
                    grace,
                } => {
                    if self.current(&key, generation) {
                        self.catch_up_beside(&key, since, now, grace);
                    }
                }
                Timer::Planned { run } => {
                    // The same grace as a fire's: beyond it, the server was
                    // down (or suspended) at the instant.
                    let grace = self.config.misfire_grace.max(RUNNING_GRACE_FLOOR);
                    let grace = SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX);
                    self.planned_due(run, now, grace);
                }
                Timer::Sla {
                    key,
                    scheduled,
                    deadline,
                    run,
                } => self.sla_due(key, scheduled, deadline, run),
                Timer::Deadline { run } => {
                    if self
                        .runs
                        .table
                        .get(&run)
                        .is_some_and(|r| r.machine.state() == RunState::Running)
                    {
                        tracing::info!(run, "run deadline passed; stopping it");
                        self.stop(run, RunState::Failed, now);
                    }
                }
            }
        }
        for (key, at) in fired {
            if let Some(entry) = self.jobs.table.get_mut(&*key) {
                entry.last_fire = Some(at);
            }
            self.arm_next_fire(&key, at);
        }
        // Read beside the loop: no timer waits for the store. The
        // read comes back as a command, and the fire is armed then.
        for (key, generation, at) in to_read {
            let read = self.job_of(&key);
            self.beside(read, move |job| Completion::Prepared {
                key,
                generation,
                at,
                job,
            });
        }
    }

    /// The job of the fire of `key` at `at` was read: arm the fire (at once
    /// if it is due), or try again in a second if the store failed.
    pub(super) fn prepared(
        &mut self,
        key: Arc<JobKey>,
        generation: u64,
        at: Timestamp,
        job: Result<Option<Arc<Job>>, StorageError>,
        now: Timestamp,
    ) {
        if !self.current(&key, generation) {
            return;
        }
        let entry = self.jobs.table.get_mut(&*key).expect("current");
        let fire_at = fires::handle_at(&entry.timing, at);
        let when = match job {
            Ok(Some(job)) => {
                entry.job.get_or_insert(job);
                fire_at
            }
            // Deleted through another node: the next sync forgets it.
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(job = %format!("{}/{}", key.0, key.1), "cannot read the job of a fire; trying again: {e}");
                let again = now.checked_add(SignedDuration::from_secs(1)).unwrap_or(now);
                self.arm(
                    again,
                    Timer::Prepare {
                        key,
                        generation,
                        at,
                    },
                );
                return;
            }
        };
        self.arm(
            when,
            Timer::Fire {
                key,
                generation,
                at,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn instant(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("in range")
    }

    fn retry(n: usize) -> Timer {
        Timer::Retry { run: 1, task: n }
    }

    fn number(timer: &Timer) -> usize {
        match timer {
            Timer::Retry { task, .. } => *task,
            _ => unreachable!("only retries here"),
        }
    }

    proptest! {
        /// The queue gives back what a heap ordered by (instant, arming
        /// order) gives: pushes and due pops interleaved at random, with
        /// instants drawn from a few so that many share one.
        #[test]
        fn the_queue_pops_by_instant_then_arming_order(
            steps in prop::collection::vec((any::<bool>(), 0i64..8), 1..200),
        ) {
            let mut queue = TimerQueue::default();
            let mut model = std::collections::BinaryHeap::new();
            let mut armed = 0usize;
            for (push, second) in steps {
                if push {
                    queue.push(instant(second), retry(armed));
                    model.push(std::cmp::Reverse((second, armed)));
                    armed += 1;
                } else {
                    let now = instant(second);
                    let expected = model
                        .peek()
                        .filter(|std::cmp::Reverse((at, _))| *at <= second)
                        .map(|std::cmp::Reverse((_, n))| *n);
                    if expected.is_some() {
                        model.pop();
                    }
                    prop_assert_eq!(queue.pop_due(now).as_ref().map(number), expected);
                }
                prop_assert_eq!(
                    queue.next_at(),
                    model.peek().map(|std::cmp::Reverse((at, _))| instant(*at))
                );
            }
        }
    }
}
