//! The device: opening it and loading the kernels, the switches read at that point, and what
//! is reported and released when the backend is dropped.

use super::*;

/// A switch that is on unless the variable is `0`.
pub(super) fn env_on(name: &str) -> bool {
    std::env::var(name).map(|v| v != "0").unwrap_or(true)
}

/// A count from the environment within `range`, else `default`.
pub(super) fn env_count(name: &str, range: std::ops::RangeInclusive<usize>, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|c| range.contains(c)).unwrap_or(default)
}

/// The first CUDA device, if our kernels run on it, and its description; `Err` says why not.
pub(super) fn usable_device(api: &Api) -> std::result::Result<(driver::DeviceInfo, String), String> {
    let d = driver::first_device(api)?;
    if d.major < 8 {
        return Err(format!("{} has compute capability {}.{}; ruvllm's kernels need 8.0 or newer", d.name, d.major, d.minor));
    }
    let desc = format!("{} (sm_{}{}, {} MiB)", d.name, d.major, d.minor, d.total_mem >> 20);
    Ok((d, desc))
}

impl CudaBackend {
    /// Opens the first CUDA device and loads the kernels; the error says why the GPU cannot be
    /// used (`ERR_GPU_UNAVAILABLE`).
    pub fn new() -> Result<Self> {
        let api = driver::api().map_err(unavailable)?;
        let (dev, desc) = usable_device(api).map_err(unavailable)?;
        let mut ctx = std::ptr::null_mut();
        let mut module = std::ptr::null_mut();
        let mut stream = std::ptr::null_mut();
        // SAFETY: driver calls with out-parameters; FATBIN is a valid fatbin image.
        unsafe {
            check(api, "cuDevicePrimaryCtxRetain", (api.primary_ctx_retain)(&mut ctx, dev.device)).map_err(|e| unavailable(e.to_string()))?;
            check(api, "cuCtxSetCurrent", (api.ctx_set_current)(ctx)).map_err(|e| unavailable(e.to_string()))?;
            check(api, "cuModuleLoadData", (api.module_load_data)(&mut module, FATBIN.as_ptr() as *const c_void))
                .map_err(|e| unavailable(format!("cannot load ruvllm's GPU kernels on {desc}: {e}")))?;
            check(api, "cuStreamCreate", (api.stream_create)(&mut stream, driver::STREAM_NON_BLOCKING)).map_err(|e| gpu_error(&e))?;
        }
        let exact = std::env::var("RUVLLM_CUDA_EXACT").is_ok_and(|v| v == "1");
        let graphs_on = env_on("RUVLLM_CUDA_GRAPHS") && !exact;
        // On unless `RUVLLM_CUDA_PDL=0`: each kernel lets its dependents start only once it has
        // passed its own wait (see kernels.cu), which shortens decode steps. (Letting them start
        // first held the multiprocessors with chains of early-started kernels waiting.)
        let pdl_env = std::env::var("RUVLLM_CUDA_PDL").unwrap_or_default();
        let pdl = dev.major >= 9 && api.launch_kernel_ex.is_some() && pdl_env != "0" && !exact;
        let pdl_decode_only = pdl_env == "decode";
        let mut evs = [std::ptr::null_mut(); 4];
        for e in evs.iter_mut() {
            // SAFETY: an out-parameter; the context is current. 2: CU_EVENT_DISABLE_TIMING.
            unsafe { check(api, "cuEventCreate", (api.event_create)(e, 2)).map_err(|e| gpu_error(&e))? };
        }
        let timing = if std::env::var_os("RUVLLM_CUDA_TIMING").is_some() {
            let (mut start, mut end) = ([std::ptr::null_mut(); 2], std::ptr::null_mut());
            // SAFETY: out-parameters; the context is current.
            unsafe {
                for e in start.iter_mut() {
                    check(api, "cuEventCreate", (api.event_create)(e, 0)).map_err(|e| gpu_error(&e))?;
                }
                check(api, "cuEventCreate", (api.event_create)(&mut end, 0)).map_err(|e| gpu_error(&e))?;
            }
            Some(Timing {
                start,
                cur: 0,
                starts_us: Vec::new(),
                end,
                pending: false,
                replays: 0,
                gpu_ms: 0.0,
                last: None,
                periods: 0,
                period_s: 0.0,
                captures: 0,
                capture_s: 0.0,
                clears: 0,
                uncaptured: 0,
            })
        } else {
            None
        };
        Ok(CudaBackend {
            api,
            ctx,
            stream,
            module,
            funcs: HashMap::new(),
            device: desc,
            widths: BufWidths { d_model: 0, q_dim: 0, kv_dim: 0, ff_dim: 0, vocab_size: 0 },
            max_batch: 0,
            bufs: Vec::new(),
            step_dev: None,
            step_host: None,
            step: Vec::new(),
            segs: None,
            segs_next: None,
            rows_part: None,
            rows_out: None,
            rows_host: None,
            top_dev: None,
            top_host: None,
            step_slot: 0,
            step_ev: [evs[0], evs[1]],
            picks: std::collections::VecDeque::new(),
            pick_ev: [evs[2], evs[3]],
            embed_pick: false,
            pass_pick: false,
            pick_kernel: env_on("RUVLLM_CUDA_PICK_KERNEL"),
            ahead_on: env_on("RUVLLM_CUDA_AHEAD"),
            mma: std::env::var("RUVLLM_CUDA_MMA").is_ok_and(|v| v == "1") && !exact,
            mmq: env_on("RUVLLM_CUDA_MMQ") && !exact,
            mmq_types: std::env::var("RUVLLM_CUDA_MMQ_TYPES").ok(),
            prefill_splits: std::env::var("RUVLLM_CUDA_PREFILL_SPLITS").ok().and_then(|v| v.parse().ok()).filter(|c| (1..=32).contains(c)),
            fuse_head: env_on("RUVLLM_CUDA_FUSE_HEAD") && !exact,
            head_blocks: env_count("RUVLLM_CUDA_HEAD_BLOCKS", 1..=HEAD_BLOCKS_MAX, HEAD_BLOCKS),
            head2_blocks: env_on("RUVLLM_CUDA_HEAD2").then(|| {
                let sms = usize::try_from(dev.sm_count).unwrap_or(0).max(1);
                env_count("RUVLLM_CUDA_HEAD2_BLOCKS", 1..=HEAD_BLOCKS_MAX, (sms * HEAD2_PER_SM).min(HEAD_BLOCKS_MAX))
            }),
            att_chunk: env_count("RUVLLM_CUDA_ATT_CHUNK", 1..=4096, DECODE_ATT_CHUNK),
            mmv_max: env_count("RUVLLM_CUDA_MMV_MAX", 1..=MMV_MAX, 1),
            head_mmv_max: env_count("RUVLLM_CUDA_HEAD_MMV_MAX", 1..=MMV_MAX, 1),
            mmvq: env_on("RUVLLM_CUDA_MMVQ"),
            mmvq1_width: env_count("RUVLLM_CUDA_MMVQ1", 0..=1 << 20, MMVQ1_WIDTH),
            att_g8n: env_on("RUVLLM_CUDA_ATT_G8N"),
            logits_dev: None,
            logits_host: None,
            head_rows: 0,
            logits_ready: false,
            argmax_part: None,
            argmax_out: None,
            argmax_host: None,
            att_part: None,
            att_counters: None,
            lr_tmp: None,
            act_buf: None,
            hidden_host: Vec::new(),
            weights: HashMap::new(),
            vectors: HashMap::new(),
            lora: HashMap::new(),
            pending: Vec::new(),
            graphs: HashMap::new(),
            seen: Default::default(),
            graphs_on: graphs_on && std::env::var_os("RUVLLM_CUDA_PROFILE").is_none(),
            profile: std::env::var_os("RUVLLM_CUDA_PROFILE").map(|_| HashMap::new()),
            pdl,
            pdl_decode_only,
            head_counter: None,
            timing,
            pending_res: None,
            fuse_res: std::env::var("RUVLLM_CUDA_FUSE").map(|v| v != "0" && v != "qk").unwrap_or(true) && !exact,
            fuse_qk: std::env::var("RUVLLM_CUDA_FUSE").is_ok_and(|v| v == "qk" || v == "all") && !exact,
            x_alt: false,
            x2: None,
            carveout: std::env::var("RUVLLM_CUDA_CARVEOUT").ok().and_then(|v| v.parse().ok()),
            exact,
            ref_scores: None,
            error: None,
        })
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let mut v: Vec<_> = p.iter().collect();
            v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
            eprintln!("ruvllm cuda profile: kernel, launches, total ms, mean us");
            for (k, (c, ms)) in v {
                eprintln!("  {k:32} {c:8} {ms:10.3} {:8.2}", ms * 1000.0 / *c as f64);
            }
        }
        if let Some(t) = self.timing.as_mut() {
            if t.replays > 0 && t.periods > 0 {
                t.starts_us.sort_by(f32::total_cmp);
                eprintln!(
                    "ruvllm cuda timing: {} decode graph replays, {:.1} us of device time each, {:.1} us between replay launches, {:.1} us between replay starts on the device (median) (pdl {})",
                    t.replays,
                    t.gpu_ms * 1000.0 / t.replays as f64,
                    t.period_s * 1e6 / t.periods as f64,
                    t.starts_us.get(t.starts_us.len() / 2).copied().unwrap_or(0.0),
                    self.pdl
                );
                eprintln!(
                    "ruvllm cuda graphs: {} captured ({:.1} ms of host time), {} cache clears, {} decode steps sent without a graph",
                    t.captures,
                    t.capture_s * 1e3,
                    t.clears,
                    t.uncaptured
                );
            }
        }
        self.current();
        // SAFETY: our stream; graphs are destroyed before the memory they use.
        unsafe { (self.api.stream_synchronize)(self.stream) };
        self.clear_graphs();
        for e in self.step_ev.iter().chain(&self.pick_ev) {
            // SAFETY: events we created; the stream is idle.
            unsafe { (self.api.event_destroy)(*e) };
        }
    }
}
