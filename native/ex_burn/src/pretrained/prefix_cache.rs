//! Prompt prefixes' KV caches, kept so a request whose prompt starts like an earlier one (a
//! shared system prompt, a chat template's preamble, the earlier turns of a conversation) runs
//! only the tokens after the shared part.
//!
//! A cache row depends only on the tokens up to it, so a prefix's saved rows are the rows the
//! new session would compute: the output is the same with or without reuse (where products run
//! at the step's row count, as on Burn's tensor path, within their last bits). The engine copies
//! rows out and in (`CausalLm::save_prefix`, `CausalLm::session_from`); engines that can't give
//! `None`, and their sessions start empty.

use std::any::Any;
use std::sync::{Arc, Mutex};

use super::{CausalLm, LmSession};
use crate::error::ExResult;

/// What one engine saved of a session's cache (`CausalLm::save_prefix`).
pub type SavedKv = Arc<dyn Any + Send + Sync>;

/// Prefixes shorter than this are run again rather than looked up and copied.
const MIN_REUSE: usize = 4;

struct Entry {
    tokens: Vec<u32>,
    kv: SavedKv,
    bytes: usize,
    used: u64,
}

/// Saved prompts of one model, at most `capacity` bytes, the least recently used evicted first.
pub struct PrefixCache {
    capacity: usize,
    entries: Mutex<(Vec<Entry>, u64)>,
}

fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new(capacity: usize) -> Self {
        PrefixCache { capacity, entries: Mutex::new((Vec::new(), 0)) }
    }

    /// A session for `prompt` holding the longest saved prefix of it (never all of it: its last
    /// token must run to give logits), and that prefix's length; `None` when nothing is reused.
    pub fn session_for(&self, lm: &dyn CausalLm, prompt: &[u32]) -> ExResult<Option<(Box<dyn LmSession>, usize)>> {
        let found = {
            let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let (entries, clock) = &mut *guard;
            *clock += 1;
            let best = entries.iter_mut().map(|e| (common(&e.tokens, prompt).min(prompt.len().saturating_sub(1)), e)).max_by_key(|(n, _)| *n);
            match best {
                Some((n, e)) if n >= MIN_REUSE => {
                    e.used = *clock;
                    Some((Arc::clone(&e.kv), n))
                }
                _ => None,
            }
        };
        Ok(found.and_then(|(kv, n)| lm.session_from(&*kv, n).map(|s| (s, n))))
    }

    /// Saves the first `tokens.len()` rows of `session` (just filled with `tokens`), unless a
    /// saved prompt already covers them; a saved prompt they extend is replaced.
    pub fn save(&self, lm: &dyn CausalLm, session: &mut dyn LmSession, tokens: &[u32]) {
        let bytes = tokens.len() * lm.kv_bytes_per_token();
        if tokens.len() < MIN_REUSE || bytes > self.capacity {
            return;
        }
        {
            let guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if guard.0.iter().any(|e| common(&e.tokens, tokens) == tokens.len()) {
                return;
            }
        }
        // copied outside the lock: other requests look up meanwhile
        let Some(kv) = lm.save_prefix(session, tokens.len()) else { return };
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (entries, clock) = &mut *guard;
        *clock += 1;
        entries.retain(|e| common(&e.tokens, tokens) < e.tokens.len());
        entries.push(Entry { tokens: tokens.to_vec(), kv, bytes, used: *clock });
        let mut total: usize = entries.iter().map(|e| e.bytes).sum();
        while total > self.capacity {
            let (i, _) = entries.iter().enumerate().min_by_key(|(_, e)| e.used).expect("over capacity means not empty");
            total -= entries.swap_remove(i).bytes;
        }
    }

    /// Saved prompts and their bytes.
    pub fn usage(&self) -> (usize, usize) {
        let guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        (guard.0.len(), guard.0.iter().map(|e| e.bytes).sum())
    }
}
