//! Where a decoded token's weight bytes go, as bandwidth: the LM head (tied embedding, per-row
//! kernel) against a plain streaming read of the same bytes, and every layer weight as decode
//! runs it (one token, packed tile GEMM where the CPU has one), grouped by type and shape.
//! Rounds alternate; medians.
//! `cargo run --release -p ruvllm-eval --example decode_bw -- MODEL.gguf [threads]`
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ruvllm_core::backend::cpu::matmul::WeightData;
use ruvllm_core::backend::cpu::{matmul, QWeight};
use ruvllm_core::gguf::GgufFile;
use ruvllm_core::runtime::ThreadPool;

/// Sums `b` as u64 words on the pool (a streaming read).
fn stream(pool: &ThreadPool, b: &[u8]) -> u64 {
    let n = b.len() / 8;
    // SAFETY: reading `n` whole u64 words inside `b` (unaligned reads are fine on x86-64).
    let w: &[u64] = unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u64, n) };
    let tasks = pool.threads() * 4;
    let per = n / tasks;
    let out: Vec<AtomicU64> = (0..tasks).map(|_| AtomicU64::new(0)).collect();
    pool.for_each(tasks, &|i| {
        let mut acc = [0u64; 8];
        for c in w[i * per..(i + 1) * per].chunks_exact(8) {
            for j in 0..8 {
                acc[j] = acc[j].wrapping_add(c[j]);
            }
        }
        out[i].store(acc.iter().fold(0, |a, &b| a.wrapping_add(b)), Ordering::Relaxed);
    });
    out.iter().map(|x| x.load(Ordering::Relaxed)).fold(0, u64::wrapping_add)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let file = GgufFile::open(args.get(1).expect("usage: decode_bw MODEL.gguf [threads]")).expect("model");
    let threads: usize = args.get(2).map_or(2, |s| s.parse().expect("threads"));
    let pool = ThreadPool::new(threads);
    let weight = |name: &str| {
        let t = file.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
        let data = WeightData::Mapped { storage: file.storage(), offset: t.offset as usize, len: t.size as usize };
        QWeight::new(t.dtype, t.dims[1] as usize, t.dims[0] as usize, data).expect("weight")
    };
    // As the model loader puts it: packed for the tile GEMM where this CPU has one, else a copy
    // on huge pages (Transformer::load / prepare).
    let head = weight(if file.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" });
    let head = if head.packs() { head } else { head.to_huge() };
    head.prepare(&pool);
    let layers: Vec<QWeight> = file.tensors.iter().filter(|t| t.name.starts_with("blk.") && t.dims.len() == 2).map(|t| weight(&t.name)).collect();
    for w in &layers {
        w.prepare(&pool);
    }
    let bytes = |w: &QWeight| w.packed(&pool).map_or(w.bytes().len(), |p| p.tiles() * p.tile_bytes());
    let x: Vec<f32> = (0..8192).map(|i| ((i * 7919 % 101) as f32 - 50.0) / 37.0).collect();
    let mut y = vec![0f32; head.rows.max(8192)];
    let (mut t_stream, mut t_head) = (vec![], vec![]);
    let mut t_layer: Vec<Vec<f64>> = vec![vec![]; layers.len()];
    let mut check = 0u64;
    for _ in 0..15 {
        let t = Instant::now();
        check ^= stream(&pool, head.packed(&pool).map_or(head.bytes(), |p| p.bytes()));
        t_stream.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        matmul(&pool, &head, &x[..head.cols], 1, &mut y[..head.rows]);
        t_head.push(t.elapsed().as_secs_f64());
        for (i, w) in layers.iter().enumerate() {
            let t = Instant::now();
            matmul(&pool, w, &x[..w.cols], 1, &mut y[..w.rows]);
            t_layer[i].push(t.elapsed().as_secs_f64());
        }
    }
    let gbps = |b: usize, s: f64| b as f64 / s / 1e9;
    let hb = bytes(&head);
    let (ts, th) = (median(&mut t_stream), median(&mut t_head));
    println!("{threads} thread(s); check {}", check % 7);
    println!("streaming read of the LM head's bytes: {:.2} ms, {:.1} GB/s", ts * 1e3, gbps(hb, ts));
    println!("LM head {} {}x{} (one token): {:.2} ms, {:.1} GB/s", head.ty.name(), head.rows, head.cols, th * 1e3, gbps(hb, th));
    let mut by: BTreeMap<String, (usize, f64, usize)> = BTreeMap::new();
    let (mut total_t, mut total_b) = (0.0, 0);
    for (w, t) in layers.iter().zip(t_layer.iter_mut()) {
        let m = median(t);
        let e = by.entry(format!("{} {}x{}", w.ty.name(), w.rows, w.cols)).or_default();
        e.0 += 1;
        e.1 += m;
        e.2 += bytes(w);
        total_t += m;
        total_b += bytes(w);
    }
    for (k, (n, t, b)) in by {
        println!("  {k}: {n} calls, {:.1} us/call, {:.0} KB each, {:.1} GB/s", t / n as f64 * 1e6, b as f64 / n as f64 / 1e3, gbps(b, t));
    }
    println!("layer weights (one token, sum of medians): {:.2} ms for {:.1} MB, {:.1} GB/s", total_t * 1e3, total_b as f64 / 1e6, gbps(total_b, total_t));
    // Weights off huge pages read slower (a TLB miss per 4 KiB): say how much of the process is on them.
    if let Ok(s) = std::fs::read_to_string("/proc/self/smaps_rollup") {
        let kb = |name: &str| s.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().nth(1)).unwrap_or("?").to_string();
        println!("process RSS {} kB, {} kB of it on huge pages", kb("Rss:"), kb("AnonHugePages:"));
    }
}
