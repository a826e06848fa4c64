//! Cost of one thread-pool job with tiny tasks: `pool_micro [threads] [tasks]`.
use ruvllm_core::runtime::ThreadPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
fn main() {
    let threads: usize = std::env::args().nth(1).map_or(2, |s| s.parse().unwrap());
    let tasks: usize = std::env::args().nth(2).map_or(8, |s| s.parse().unwrap());
    let pool = ThreadPool::new(threads);
    let hits = AtomicUsize::new(0);
    for gap_us in [0u64, 5, 20] {
        let mut ts = vec![];
        for _ in 0..20000 {
            if gap_us > 0 {
                let t = Instant::now();
                while t.elapsed().as_micros() < gap_us as u128 {}
            }
            let t = Instant::now();
            pool.for_each(tasks, &|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
            ts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        ts.sort_by(|a, b| a.total_cmp(b));
        println!(
            "threads {threads} tasks {tasks} gap {gap_us} us: p50 {:.2} us p90 {:.2} p99 {:.2}",
            ts[ts.len() / 2],
            ts[ts.len() * 9 / 10],
            ts[ts.len() * 99 / 100]
        );
    }
}
