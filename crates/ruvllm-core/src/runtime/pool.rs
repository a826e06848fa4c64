//! The thread pool the kernels split their work over: a fixed set of workers per model that
//! spin briefly between jobs and then park, so a `for_each` costs about a microsecond while
//! work flows.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Lets the tasks of one `ThreadPool::for_each` write disjoint parts of one buffer.
pub(crate) struct SharedMut<T = f32>(pub(crate) *mut T);
// SAFETY: only used to hand disjoint ranges of one live buffer to the tasks of one
// `for_each`, which returns before the buffer's borrow ends.
unsafe impl<T> Send for SharedMut<T> {}
// SAFETY: as above; no two tasks touch the same element.
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> Clone for SharedMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// A method (not field access) so closures capture the whole `Sync` wrapper.
    #[inline(always)]
    pub(crate) fn ptr(self) -> *mut T {
        self.0
    }
}

/// How long an idle worker spins (checking for new work) before it parks. Decode issues a
/// matmul every few microseconds, so workers stay hot within a token; between requests they
/// sleep.
const SPIN_TIME: Duration = Duration::from_micros(300);

type JobPtr = *const (dyn Fn(usize) + Sync + 'static);

/// `Shared::state` layout: generation in the high 32 bits, `CLOSED` flag, and the number of
/// workers registered on the current job in the low bits.
const CLOSED: u64 = 1 << 31;
const COUNT_MASK: u64 = CLOSED - 1;

struct Shared {
    /// Generation (high 32 bits) | CLOSED | registered-worker count. A worker may only touch
    /// `job` after registering with a CAS on the generation it saw while the job is open, so
    /// the caller never waits for workers that were not running when the job was published.
    state: AtomicU64,
    /// The current job; written only by the caller holding `ThreadPool::call` while no worker
    /// is registered, before the new generation is published.
    job: UnsafeCell<Option<JobPtr>>,
    n_tasks: AtomicUsize,
    next: AtomicUsize,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    shutdown: AtomicBool,
    panicked: AtomicBool,
}

// SAFETY: `job` is only written while no worker can read it (see `for_each`), and the closure
// it points to is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// Publishes a new generation (job or shutdown) and wakes parked workers.
    fn publish(&self, state: u64) {
        self.state.store(state, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.cv.notify_all();
        }
    }
}

/// A fixed pool of worker threads, created once per model (no per-op spawning).
///
/// Workers spin for a short while after each job, then park on a condition variable, so a
/// `for_each` costs about a microsecond while work is flowing. The calling thread takes tasks
/// too and never waits for a worker that has not started (tasks are claimed from a shared
/// counter), which keeps the pool fast when the machine is oversubscribed. `for_each` may be
/// called from several threads; a call that finds the pool busy (or that is nested inside a
/// task) runs its tasks on the calling thread instead of waiting.
pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes jobs; holds the current generation.
    call: Mutex<u32>,
}

impl ThreadPool {
    /// `n` threads in all, the calling thread included (`n = 0` is treated as 1).
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(None),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(n - 1);
        for i in 1..n {
            let sh = shared.clone();
            let spawned = std::thread::Builder::new().name(format!("ruvllm-kernel-{i}")).spawn(move || worker_loop(&sh));
            match spawned {
                Ok(h) => workers.push(h),
                Err(_) => break, // run with fewer threads rather than fail
            }
        }
        Self { n: workers.len() + 1, shared, workers, call: Mutex::new(0) }
    }

    /// Number of threads, the caller included.
    pub fn threads(&self) -> usize {
        self.n
    }

    /// Runs `f(i)` for i in 0..n_tasks across the pool, returning when all are done.
    /// A panic in a task is re-raised on the calling thread after all tasks have finished.
    pub fn for_each(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let mut guard = match self.call.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                (0..n_tasks).for_each(f);
                return;
            }
        };
        let sh = &*self.shared;
        // Invariant here: the previous job is CLOSED with no registered worker.
        // SAFETY: the lifetime is erased only for the duration of this call: the job is closed
        // and every registered worker has deregistered before we return, and unregistered
        // workers never dereference it.
        let job: JobPtr = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), JobPtr>(f) };
        unsafe { *sh.job.get() = Some(job) };
        sh.n_tasks.store(n_tasks, Ordering::Relaxed);
        sh.next.store(0, Ordering::Relaxed);
        *guard = guard.wrapping_add(1);
        sh.publish((*guard as u64) << 32);
        let mut payload = None;
        loop {
            let i = sh.next.fetch_add(1, Ordering::Relaxed);
            if i >= n_tasks {
                break;
            }
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                payload.get_or_insert(p);
            }
        }
        // Every task is claimed; close the job and wait for the workers still running one.
        let mut st = sh.state.fetch_or(CLOSED, Ordering::AcqRel) | CLOSED;
        let mut spins = 0u32;
        while st & COUNT_MASK != 0 {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            st = sh.state.load(Ordering::Acquire);
        }
        // SAFETY: every worker has deregistered (count 0) and new ones see CLOSED, so no one
        // reads the slot; we hold the submit lock.
        unsafe { *sh.job.get() = None };
        drop(guard);
        if let Some(p) = payload {
            resume_unwind(p);
        }
        if sh.panicked.swap(false, Ordering::Relaxed) {
            panic!("ThreadPool: a task panicked on a worker thread");
        }
    }
}

fn worker_loop(sh: &Shared) {
    // Generation 0 is the initial, closed state: a worker that starts late still sees every
    // later generation (including shutdown) as new.
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin a little, then park.
        let mut spins = 0u32;
        let mut start: Option<Instant> = None;
        let st = loop {
            let st = sh.state.load(Ordering::Acquire);
            if st >> 32 != seen {
                break st;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(128) {
                std::hint::spin_loop();
                continue;
            }
            let t0 = *start.get_or_insert_with(Instant::now);
            if t0.elapsed() < SPIN_TIME {
                continue;
            }
            let mut guard = sh.lock.lock().unwrap_or_else(|p| p.into_inner());
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            while sh.state.load(Ordering::SeqCst) >> 32 == seen {
                guard = sh.cv.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            start = None;
        };
        seen = st >> 32;
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Register on this generation's job unless it is already closed.
        let mut cur = st;
        let registered = loop {
            if cur >> 32 != seen || cur & CLOSED != 0 {
                break false;
            }
            match sh.state.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break true,
                Err(c) => cur = c,
            }
        };
        if !registered {
            continue;
        }
        // SAFETY: registered on an open job: the caller keeps `job` alive and unchanged until
        // we deregister.
        if let Some(job) = unsafe { *sh.job.get() } {
            let n = sh.n_tasks.load(Ordering::Relaxed);
            loop {
                let i = sh.next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                // SAFETY: as above, `job` stays alive until we deregister.
                if catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(i) })).is_err() {
                    sh.panicked.store(true, Ordering::Relaxed);
                }
            }
        }
        sh.state.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        let g = {
            let mut g = self.call.lock().unwrap_or_else(|p| p.into_inner());
            *g = g.wrapping_add(1);
            *g
        };
        sh.publish(((g as u64) << 32) | CLOSED);
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}
