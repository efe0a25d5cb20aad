//! Live logs across a cluster: a node publishes the output so far of the
//! attempts it runs (its own and its agents') to the shared store every
//! [`PUBLISH_EVERY`], so that any node can show a running attempt's
//! output; an attempt's row is withdrawn once its end is committed (its
//! whole log is then stored with it).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use dagcron_store::prelude::*;
use dagcron_store::{LiveLogWrite, RunId};
use tokio_util::sync::CancellationToken;

use crate::EngineHandle;

/// How often a node publishes the output of its running attempts.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

type Key = (RunId, String, u32);

/// What to write to publish `now` (each live log's output and whether its
/// attempt has ended), given the length last published of each: logs
/// that grew, and withdrawals of those no longer live here. Updates
/// `sent`.
pub fn changes(
    now: Vec<(Key, Vec<u8>, bool)>,
    sent: &mut HashMap<Key, usize>,
) -> Vec<LiveLogWrite> {
    let mut writes = Vec::new();
    let here: HashSet<Key> = now.iter().map(|(k, _, _)| k.clone()).collect();
    for ((run, task, number), bytes, done) in now {
        let key = (run, task.clone(), number);
        if done || bytes.is_empty() || sent.get(&key) == Some(&bytes.len()) {
            continue;
        }
        sent.insert(key, bytes.len());
        writes.push(LiveLogWrite {
            run,
            task,
            number,
            log: Some(bytes),
        });
    }
    sent.retain(|(run, task, number), _| {
        let keep = here.contains(&(*run, task.clone(), *number));
        if !keep {
            writes.push(LiveLogWrite {
                run: *run,
                task: task.clone(),
                number: *number,
                log: None,
            });
        }
        keep
    });
    writes
}

/// Publishes this node's live logs until `stop`.
pub async fn publish<S: Store>(store: Arc<S>, engine: EngineHandle, stop: CancellationToken) {
    let mut sent: HashMap<Key, usize> = HashMap::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PUBLISH_EVERY) => {}
        }
        let now = engine
            .live_logs()
            .into_iter()
            .map(|(key, log)| {
                let (bytes, done) = log.read_from(0);
                (key, bytes, done)
            })
            .collect();
        let writes = changes(now, &mut sent);
        if writes.is_empty() {
            continue;
        }
        if let Err(e) = store.put_live_logs(writes).await {
            tracing::warn!("cannot publish the output of running attempts: {e}");
            // Published again once the store answers.
            sent.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> Key {
        (7, "t".into(), n)
    }

    #[test]
    fn a_log_is_published_as_it_grows_and_withdrawn_once_gone() {
        let mut sent = HashMap::new();
        let w = changes(vec![(key(1), b"a".to_vec(), false)], &mut sent);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].log.as_deref(), Some(&b"a"[..]));
        // Unchanged: nothing to write.
        assert!(changes(vec![(key(1), b"a".to_vec(), false)], &mut sent).is_empty());
        // Grown, and a second attempt with no output yet.
        let w = changes(
            vec![(key(1), b"ab".to_vec(), false), (key(2), vec![], false)],
            &mut sent,
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].log.as_deref(), Some(&b"ab"[..]));
        // Ended (its end not yet committed): left as it is.
        assert!(changes(vec![(key(1), b"abc".to_vec(), true)], &mut sent).is_empty());
        // Gone from this node: withdrawn, once.
        let w = changes(vec![], &mut sent);
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].number, w[0].log.is_none()), (1, true));
        assert!(changes(vec![], &mut sent).is_empty());
    }
}
