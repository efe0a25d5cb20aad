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
/// The most of an attempt's output published: its last bytes (the whole
/// log is stored when the attempt ends).
pub const PUBLISHED_TAIL: usize = 64 << 10;

type Key = (RunId, String, u32);

/// A live log as read to publish: its key, its last bytes, how many came
/// before them, and whether its attempt has ended.
pub type Published = (Key, Vec<u8>, u64, bool);

/// What to write to publish `now`, given the length last published of
/// each: logs that grew, and withdrawals of those no longer live here.
/// Updates `sent`.
pub fn changes(now: Vec<Published>, sent: &mut HashMap<Key, u64>) -> Vec<LiveLogWrite> {
    let mut writes = Vec::new();
    let here: HashSet<Key> = now.iter().map(|(k, _, _, _)| k.clone()).collect();
    for ((run, task, number), bytes, skipped, done) in now {
        let key = (run, task.clone(), number);
        let length = skipped + bytes.len() as u64;
        if done || length == 0 || sent.get(&key) == Some(&length) {
            continue;
        }
        sent.insert(key, length);
        writes.push(LiveLogWrite {
            run,
            task,
            number,
            log: Some(bytes),
            skipped,
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
                skipped: 0,
            });
        }
        keep
    });
    writes
}

/// Publishes this node's live logs until `stop`.
pub async fn publish<S: Store>(store: Arc<S>, engine: EngineHandle, stop: CancellationToken) {
    let mut sent: HashMap<Key, u64> = HashMap::new();
    // Withdrawals a failed write left to do.
    let mut owed: Vec<LiveLogWrite> = Vec::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PUBLISH_EVERY) => {}
        }
        let now = engine
            .live_logs()
            .into_iter()
            .map(|(key, log)| {
                let (bytes, skipped, done) = log.published(PUBLISHED_TAIL);
                (key, bytes, skipped, done)
            })
            .collect();
        let mut writes = std::mem::take(&mut owed);
        writes.extend(changes(now, &mut sent));
        if writes.is_empty() {
            continue;
        }
        if let Err(e) = store.put_live_logs(writes.clone()).await {
            tracing::warn!("cannot publish the output of running attempts: {e}");
            // Published again once the store answers; withdrawn then too.
            sent.clear();
            owed = writes.into_iter().filter(|w| w.log.is_none()).collect();
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
        let w = changes(vec![(key(1), b"a".to_vec(), 0, false)], &mut sent);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].log.as_deref(), Some(&b"a"[..]));
        // Unchanged: nothing to write.
        assert!(changes(vec![(key(1), b"a".to_vec(), 0, false)], &mut sent).is_empty());
        // Grown (its first byte no longer in the tail), and a second
        // attempt with no output yet.
        let w = changes(
            vec![
                (key(1), b"b".to_vec(), 1, false),
                (key(2), vec![], 0, false),
            ],
            &mut sent,
        );
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].log.as_deref(), w[0].skipped), (Some(&b"b"[..]), 1));
        // Ended (its end not yet committed): left as it is.
        assert!(changes(vec![(key(1), b"bc".to_vec(), 1, true)], &mut sent).is_empty());
        // Gone from this node: withdrawn, once.
        let w = changes(vec![], &mut sent);
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].number, w[0].log.is_none()), (1, true));
        assert!(changes(vec![], &mut sent).is_empty());
    }
}
