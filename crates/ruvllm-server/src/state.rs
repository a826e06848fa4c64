//! What every request shares: the engine, the API key, the admission limits and the cancel
//! flags of the requests that are running.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ruvllm_core::engine::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::handlers::{Cors, ModelFile};
use crate::metrics::Metrics;
use crate::ServerOptions;

pub struct State {
    pub engine: Arc<Engine>,
    pub model: String,
    pub context: usize,
    pub embedding_length: usize,
    pub max_body_bytes: usize,
    pub created: u64,
    pub chat_template: Option<String>,
    pub chat_stops: Vec<String>,
    pub metrics: Arc<Metrics>,
    /// `None`: CORS off (no `Access-Control-*` headers, `OPTIONS` is not answered).
    pub cors: Option<Cors>,
    /// The served file, as `/api/tags` describes it.
    pub file: ModelFile,
    /// SHA-256 of the API key: comparing digests takes the same time whatever the key's length
    /// and wherever a guess first differs.
    key_digest: Option<[u8; 32]>,
    parallel: usize,
    max_queue: usize,
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    closing: AtomicBool,
    cancels: Mutex<Vec<Weak<AtomicBool>>>,
}

/// Sets a request's cancel flag when dropped: held by the handler (a non-streamed request) or
/// by the response body (a streamed one), whichever hyper drops when the client goes away.
pub struct CancelOnDrop(pub Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Counts a request in the queue while it waits for a slot.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

impl State {
    pub fn new(engine: Arc<Engine>, o: &ServerOptions, cors: Option<Cors>) -> State {
        let info = engine.info();
        State {
            file: ModelFile::stat(&info.path),
            metrics: Arc::new(Metrics::default()),
            cors,
            context: info.context_length,
            embedding_length: info.embedding_length,
            engine,
            model: o.model_id.clone(),
            max_body_bytes: o.max_body_bytes,
            created: crate::openai::now(),
            chat_template: o.chat_template.clone(),
            chat_stops: o.chat_stops.clone(),
            key_digest: o.api_key.as_deref().map(digest),
            parallel: o.parallel,
            max_queue: o.max_queue,
            permits: Arc::new(Semaphore::new(o.parallel)),
            waiting: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            cancels: Mutex::new(Vec::new()),
        }
    }

    /// Whether the request's `Authorization` header carries the key (always, without a key).
    pub fn authorized(&self, header: Option<&[u8]>) -> bool {
        let Some(want) = &self.key_digest else { return true };
        let Some(given) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else { return false };
        let given = String::from_utf8_lossy(given);
        bool::from(digest(given.trim()).ct_eq(want))
    }

    /// Waits for a slot to hand a request to the engine; 429 when `max_queue` requests already
    /// wait, 503 once the server is closing.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        let closing = ApiError::closing;
        if self.closing.load(Ordering::SeqCst) {
            return Err(closing());
        }
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return Ok(p);
        }
        let ahead = self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        if ahead >= self.max_queue {
            return Err(ApiError::busy(self.parallel + self.max_queue));
        }
        self.permits.clone().acquire_owned().await.map_err(|_| closing())
    }

    /// A new request's cancel flag, set by `begin_close`.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(self.closing.load(Ordering::SeqCst)));
        let mut list = self.cancels.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&flag));
        flag
    }

    /// Refuses new work and cancels every request that runs or waits.
    pub fn begin_close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.permits.close();
        for f in self.cancels.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            if let Some(f) = f.upgrade() {
                f.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Requests handed to the engine now, and requests waiting for a slot.
    pub fn load(&self) -> (usize, usize) {
        (self.parallel.saturating_sub(self.permits.available_permits()), self.waiting.load(Ordering::SeqCst))
    }

    pub fn parallel(&self) -> usize {
        self.parallel
    }
}

/// This process's resident set size in bytes (Linux; `None` elsewhere).
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_on_drop_sets_the_flag() {
        let f = Arc::new(AtomicBool::new(false));
        drop(CancelOnDrop(f.clone()));
        assert!(f.load(Ordering::SeqCst));
    }

    #[test]
    fn rss_is_read() {
        if cfg!(target_os = "linux") {
            assert!(rss_bytes().is_some_and(|b| b > 0));
        }
    }
}
