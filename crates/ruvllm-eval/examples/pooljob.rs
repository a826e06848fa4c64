use std::time::Instant;
use ruvllm_core::runtime::ThreadPool;
fn main() {
    let pool = ThreadPool::new(2);
    let x = std::sync::atomic::AtomicU64::new(0);
    for round in 0..6 {
        let n = 200_000;
        let t = Instant::now();
        for _ in 0..n {
            pool.for_each(2, &|i| { x.fetch_add(i as u64, std::sync::atomic::Ordering::Relaxed); });
        }
        let per = t.elapsed().as_secs_f64() / n as f64 * 1e9;
        // a job with ~5 us of work per task
        let t = Instant::now();
        let m = 20_000;
        for _ in 0..m {
            pool.for_each(2, &|_i| { let t0 = Instant::now(); while t0.elapsed().as_nanos() < 5000 { std::hint::spin_loop(); } });
        }
        let per5 = t.elapsed().as_secs_f64() / m as f64 * 1e9;
        println!("round {round}: empty job {per:.0} ns, 5us job {per5:.0} ns");
    }
}
