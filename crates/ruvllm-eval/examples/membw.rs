//! The decode-speed floor of a model on this machine: streaming-read bandwidth measured with our
//! own thread pool (the faster of a plain read and one with software prefetch), and the bytes a
//! decoded token must read (every weight once; a tied embedding is read whole as the LM head, an
//! untied one only gathers a row; greedy decoding reads a Q8_0 head's screening copy instead,
//! where this CPU screens: `bytesPerToken`, with `fullBytesPerToken` beside it).
//! `cargo run --release -p ruvllm-eval --example membw -- MODEL.gguf [threads]` prints one JSON line.
use std::time::Instant;

use ruvllm_core::backend::cpu::GgmlType;
use ruvllm_core::gguf::GgufFile;
use ruvllm_core::runtime::mem::HugeBuf;
use ruvllm_core::runtime::ThreadPool;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: membw MODEL.gguf [threads]");
    let threads: usize = args.get(2).map_or(2, |s| s.parse().expect("threads"));
    let file = GgufFile::open(path).expect("model");
    let untied = file.tensor("output.weight").is_some();
    let full_bytes: u64 = file.tensors.iter().filter(|t| !(untied && t.name == "token_embd.weight")).map(|t| t.size).sum();
    // Greedy decoding (the race's) screens a Q8_0 head where this CPU has the screening kernel
    // (`matmul::head_argmax`): it reads the head's screening copy (24 bytes per block and row,
    // 16-row tiles) instead of the head, plus a few candidate tiles (~0.2 MB for Gemma 3,
    // not counted).
    let head = file.tensor(if untied { "output.weight" } else { "token_embd.weight" });
    let screened = head.filter(|h| h.dtype == GgmlType::Q8_0 && ruvllm_core::backend::cpu::dispatch::screen_kernel().is_some());
    let bytes_per_token = match screened {
        Some(h) => full_bytes - h.size + h.dims[1].div_ceil(16) * 16 * (h.dims[0] / 32) * 24,
        None => full_bytes,
    };

    // 1 GiB of u64s (far beyond any cache), written first so pages are resident; on huge pages
    // like the weights decode reads (runtime::mem), unless MEMBW_SMALL_PAGES is set.
    let n = (1usize << 30) / 8;
    let mut bytes = if std::env::var_os("MEMBW_SMALL_PAGES").is_some() { None } else { Some(HugeBuf::new(n * 8)) };
    let mut heap: Vec<u64> = Vec::new();
    let buf: &mut [u64] = match &mut bytes {
        // SAFETY: the buffer is 4 KiB aligned and `n * 8` bytes long; u64 has no invalid values.
        Some(b) => unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u64, n) },
        None => {
            heap.resize(n, 0);
            &mut heap
        }
    };
    for (i, x) in buf.iter_mut().enumerate() {
        *x = i as u64;
    }
    let buf = &*buf;
    let pool = ThreadPool::new(threads);
    let tasks = threads * 4;
    let per = n / tasks;
    let sums: Vec<std::sync::atomic::AtomicU64> = (0..tasks).map(|_| Default::default()).collect();
    // Two reads of the buffer, alternating, best of 7 passes each: a plain sequential sum, and
    // the same with a software prefetch 8 KiB ahead (as the decode kernels prefetch their weight
    // tiles). On one core the hardware prefetchers alone fall short (here 35 against 41 GB/s), so
    // the floor is the faster of the two.
    const AHEAD_WORDS: usize = 8192 / 8;
    let (mut plain, mut ahead) = (0f64, 0f64);
    for pass in 0..14 {
        let prefetch = pass % 2 == 1;
        let t = Instant::now();
        pool.for_each(tasks, &|i| {
            let s = &buf[i * per..(i + 1) * per];
            let mut acc = [0u64; 8];
            for c in s.chunks_exact(8) {
                #[cfg(target_arch = "x86_64")]
                if prefetch {
                    // SAFETY: a prefetch never faults; the address is only computed.
                    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(c.as_ptr().wrapping_add(AHEAD_WORDS) as *const i8) };
                }
                for j in 0..8 {
                    acc[j] = acc[j].wrapping_add(c[j]);
                }
            }
            sums[i].store(acc.iter().fold(0u64, |a, &b| a.wrapping_add(b)), std::sync::atomic::Ordering::Relaxed);
        });
        let gbps = (tasks * per * 8) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let best = if prefetch { &mut ahead } else { &mut plain };
        *best = best.max(gbps);
    }
    let best = plain.max(ahead);
    let check: u64 = sums.iter().map(|s| s.load(std::sync::atomic::Ordering::Relaxed)).fold(0, u64::wrapping_add);
    let floor_ms = bytes_per_token as f64 / (best * 1e9) * 1e3;
    println!(
        "{{\"threads\":{threads},\"readGBps\":{best:.2},\"plainGBps\":{plain:.2},\"prefetchGBps\":{ahead:.2},\"bytesPerToken\":{bytes_per_token},\"fullBytesPerToken\":{full_bytes},\"headScreened\":{},\"floorMsPerToken\":{floor_ms:.3},\"floorTokensPerSecond\":{:.1},\"check\":{}}}",
        screened.is_some(),
        1e3 / floor_ms,
        check % 1000
    );
}
