//! A cluster node's lease as this process sees it, and the watchdog that
//! kills every attempt when it ends.

use super::*;

/// The end of a node's lease, shared between the code that renews it and
/// the engine that must stop before it ends.
#[derive(Clone, Debug)]
pub struct Lease(pub(super) Arc<LeaseInner>);

#[derive(Debug)]
pub(super) struct LeaseInner {
    /// Microseconds since the epoch, by the engine's clock.
    end: std::sync::atomic::AtomicI64,
    pub(super) revoked: CancellationToken,
}

impl Default for Lease {
    fn default() -> Lease {
        Lease::new()
    }
}

impl Lease {
    /// A lease that has already ended.
    pub fn new() -> Lease {
        Lease(Arc::new(LeaseInner {
            end: std::sync::atomic::AtomicI64::new(i64::MIN),
            revoked: CancellationToken::new(),
        }))
    }

    /// Moves the end of the lease (never backwards, never after a revocation).
    pub fn extend_to(&self, end: Timestamp) {
        if !self.0.revoked.is_cancelled() {
            self.0
                .end
                .fetch_max(end.as_microsecond(), std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Ends the lease now, for good: the engine stops at once.
    pub fn revoke(&self) {
        self.0.revoked.cancel();
        self.0
            .end
            .store(i64::MIN, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the lease still runs at `now`.
    pub fn is_valid_at(&self, now: Timestamp) -> bool {
        !self.0.revoked.is_cancelled()
            && now.as_microsecond() < self.0.end.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The current end of the lease.
    pub(super) fn end(&self) -> Timestamp {
        Timestamp::from_microsecond(self.0.end.load(std::sync::atomic::Ordering::SeqCst))
            .unwrap_or(Timestamp::MIN)
    }
}

/// Kills every attempt of a cluster node once its lease ends (by this
/// process's clock) or is revoked, then waits until their processes are
/// gone, and only then says the node is fenced. It runs beside the engine's
/// loop, so that a loop waiting on a database that no longer answers (a
/// network partition) cannot keep attempts running past the lease, while
/// another node retries them.
pub(super) async fn lease_watchdog(
    lease: Lease,
    clock: Arc<dyn Clock>,
    kill: CancellationToken,
    attempts: tokio_util::task::TaskTracker,
    done: CancellationToken,
    fenced: CancellationToken,
) {
    loop {
        let end = lease.end();
        tokio::select! {
            () = done.cancelled() => return,
            () = lease.0.revoked.cancelled() => break,
            () = clock.sleep_until(end) => {
                if !lease.is_valid_at(clock.now()) {
                    break;
                }
            }
        }
    }
    tracing::error!("this node's lease ended: killing every attempt it runs");
    kill.cancel();
    attempts.close();
    let bound = dagcron_exec::PIPE_GRACE + Duration::from_secs(3);
    if tokio::time::timeout(bound, attempts.wait()).await.is_err() {
        tracing::error!("attempts did not end within {bound:?} of being killed");
    }
    fenced.cancel();
}
