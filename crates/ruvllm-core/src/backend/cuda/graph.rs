//! Sending the recorded launches: as they are, timed one by one (`RUVLLM_CUDA_PROFILE`), or
//! as a CUDA graph captured the second time a list is seen; and the synchronisation around them.

use super::*;
use driver::CUgraph;

impl CudaBackend {
    pub(super) fn push(&mut self, name: &str, grid: [u32; 3], block: u32, args: Args) {
        if !self.ok() {
            return;
        }
        if self.pending_res.is_some() {
            // Whatever comes next may read X or Xn: the residual step runs first.
            self.settle();
        }
        let func = self.func(name);
        // The name only labels the profile; decode records ~190 launches per token.
        let name = if self.profile.is_some() { name.to_string() } else { String::new() };
        self.pending.push(Launch { name, func, grid, block, args: args.words, offs: args.offs });
    }
    pub(super) fn blocks(count: usize, per: usize) -> u32 {
        count.div_ceil(per).max(1) as u32
    }

    /// Sends the recorded launches (after the step block), as a graph when this list was seen
    /// before.
    pub(super) fn flush(&mut self) {
        self.settle();
        if self.pending.is_empty() || !self.ok() {
            self.pending.clear();
            return;
        }
        self.current();
        let api = self.api;
        let res = (|| -> std::result::Result<(), CudaError> {
            // The step block, from the host slot whose last upload is done.
            let slot = self.step_slot;
            // SAFETY: our event (one never recorded returns at once).
            unsafe { check(api, "cuEventSynchronize", (api.event_synchronize)(self.step_ev[slot]))? };
            let (cap, n) = (self.step.len(), self.step_words().min(self.step.len()));
            let Some(host) = self.step_host.as_mut() else {
                // `reserve` could not allocate it (reported then); nothing can run.
                return Err(CudaError { call: "cuMemAllocHost", code: driver::CUDA_ERROR_OUT_OF_MEMORY, message: "no step buffer".into() });
            };
            host.as_i32(2 * cap)[slot * cap..slot * cap + n].copy_from_slice(&self.step[..n]);
            let src = (host.ptr as *mut i32).wrapping_add(slot * cap) as *const c_void;
            let dst = Self::ptr_of(&self.step_dev);
            // SAFETY: both hold `n` i32s; the host slot is page-locked and not rewritten before
            // its event says the copy is done.
            unsafe { check(api, "cuMemcpyHtoDAsync", (api.memcpy_htod_async)(dst, src, n * 4, self.stream))? };
            if std::mem::take(&mut self.pass_pick) && !self.pick_kernel {
                // The pass's token is the last queued pick (stream order: after its LM head).
                // SAFETY: device buffers of at least these sizes.
                unsafe { check(api, "cuMemcpyDtoDAsync", (api.memcpy_dtod_async)(dst + 16, Self::ptr_of(&self.argmax_out) + PICK_OFFSET, 4, self.stream))? };
            }
            // SAFETY: our event, on our stream.
            unsafe { check(api, "cuEventRecord", (api.event_record)(self.step_ev[slot], self.stream))? };
            self.step_slot ^= 1;
            let graphable = self.graphs_on && (self.step[1] as usize <= GRAPH_ROWS || self.segs.is_some_and(|p| p.decode));
            let sig = if graphable { signature(&self.pending) } else { 0 };
            if graphable {
                if let Some(g) = self.graphs.get(&sig) {
                    let exec = g.exec;
                    return self.launch_graph(exec);
                }
                if self.seen.remove(&sig) {
                    let t0 = std::time::Instant::now();
                    let g = self.capture()?;
                    if let Some(t) = self.timing.as_mut() {
                        t.captures += 1;
                        t.capture_s += t0.elapsed().as_secs_f64();
                    }
                    self.launch_graph(g.exec)?;
                    if self.graphs.len() >= MAX_GRAPHS {
                        self.clear_graphs();
                    }
                    self.graphs.insert(sig, g);
                    return Ok(());
                }
                if self.seen.len() >= MAX_SEEN {
                    self.seen.clear();
                }
                self.seen.insert(sig);
                if let Some(t) = self.timing.as_mut() {
                    t.uncaptured += 1;
                }
            }
            if self.profile.is_some() {
                return self.launch_profiled();
            }
            self.launch_all()
        })();
        self.pending.clear();
        if let Err(e) = res {
            self.fail(gpu_error(&e));
        }
    }

    /// Replays a captured step (timed with `RUVLLM_CUDA_TIMING`).
    pub(super) fn launch_graph(&mut self, exec: CUgraphExec) -> std::result::Result<(), CudaError> {
        let (api, stream) = (self.api, self.stream);
        let Some(t) = self.timing.as_mut() else {
            // SAFETY: an instantiated graph of launches on live buffers.
            return unsafe { check(api, "cuGraphLaunch", (api.graph_launch)(exec, stream)) };
        };
        // SAFETY: events of our context recorded on our stream around the replay; the last
        // replay's end event is waited for before its time is read.
        unsafe {
            if t.pending {
                check(api, "cuEventSynchronize", (api.event_synchronize)(t.end))?;
                let mut ms = 0f32;
                check(api, "cuEventElapsedTime", (api.event_elapsed_time)(&mut ms, t.start[t.cur], t.end))?;
                t.gpu_ms += ms as f64;
                if t.replays > 0 {
                    let mut gap = 0f32;
                    check(api, "cuEventElapsedTime", (api.event_elapsed_time)(&mut gap, t.start[t.cur ^ 1], t.start[t.cur]))?;
                    t.starts_us.push(gap * 1000.0);
                }
                t.replays += 1;
                t.cur ^= 1;
            }
            let now = std::time::Instant::now();
            if let Some(prev) = t.last {
                t.periods += 1;
                t.period_s += (now - prev).as_secs_f64();
            }
            t.last = Some(now);
            check(api, "cuEventRecord", (api.event_record)(t.start[t.cur], stream))?;
            check(api, "cuGraphLaunch", (api.graph_launch)(exec, stream))?;
            check(api, "cuEventRecord", (api.event_record)(t.end, stream))?;
        }
        t.pending = true;
        Ok(())
    }

    pub(super) fn launch_all(&self) -> std::result::Result<(), CudaError> {
        let api = self.api;
        let mut params: Vec<*mut c_void> = Vec::with_capacity(24);
        let pdl = (self.pdl && (!self.pdl_decode_only || self.step.get(1) == Some(&1))).then_some(api.launch_kernel_ex).flatten();
        let mut attr = driver::LaunchAttribute { id: driver::LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, pad: [0; 4], value: [0; 8] };
        attr.value[0] = 1;
        for l in &self.pending {
            params.clear();
            params.extend(l.offs.iter().map(|&o| l.args[o as usize..].as_ptr() as *mut c_void));
            if let Some(launch_ex) = pdl {
                let cfg =
                    driver::LaunchConfig { grid: l.grid, block: [l.block, 1, 1], shared_mem_bytes: 0, stream: self.stream, attrs: &mut attr, num_attrs: 1 };
                // SAFETY: as below; `cfg` and its one attribute live across the call, and every
                // kernel waits for the previous grid (`pdl_wait`) before it reads or writes
                // anything the previous grids touch.
                unsafe { check(api, "cuLaunchKernelEx", launch_ex(&cfg, l.func, params.as_mut_ptr(), std::ptr::null_mut()))? };
                continue;
            }
            // SAFETY: each parameter pointer addresses the argument's bytes, laid out as the
            // kernel declares them (8-byte slots; i32/f32 in the low bytes, little-endian).
            unsafe {
                check(
                    api,
                    "cuLaunchKernel",
                    (api.launch_kernel)(l.func, l.grid[0], l.grid[1], l.grid[2], l.block, 1, 1, 0, self.stream, params.as_mut_ptr(), std::ptr::null_mut()),
                )?;
            }
        }
        Ok(())
    }

    /// Each launch between two events, timed (slow; for finding where a step's time goes).
    pub(super) fn launch_profiled(&mut self) -> std::result::Result<(), CudaError> {
        let api = self.api;
        let mut params: Vec<*mut c_void> = Vec::new();
        let (mut e0, mut e1) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: events on our context and stream; parameters as in `launch_all`.
        unsafe {
            check(api, "cuEventCreate", (api.event_create)(&mut e0, 0))?;
            check(api, "cuEventCreate", (api.event_create)(&mut e1, 0))?;
            for l in &self.pending {
                params.clear();
                params.extend(l.offs.iter().map(|&o| l.args[o as usize..].as_ptr() as *mut c_void));
                check(api, "cuEventRecord", (api.event_record)(e0, self.stream))?;
                check(
                    api,
                    "cuLaunchKernel",
                    (api.launch_kernel)(l.func, l.grid[0], l.grid[1], l.grid[2], l.block, 1, 1, 0, self.stream, params.as_mut_ptr(), std::ptr::null_mut()),
                )?;
                check(api, "cuEventRecord", (api.event_record)(e1, self.stream))?;
                check(api, "cuEventSynchronize", (api.event_synchronize)(e1))?;
                let mut ms = 0f32;
                check(api, "cuEventElapsedTime", (api.event_elapsed_time)(&mut ms, e0, e1))?;
                let key = format!("{} n={}", l.name, if self.step[1] <= MMV_MAX as i32 { "decode" } else { "batch" });
                let e = self.profile.as_mut().unwrap().entry(key).or_default();
                e.0 += 1;
                e.1 += ms as f64;
            }
        }
        Ok(())
    }

    pub(super) fn capture(&self) -> std::result::Result<Graph, CudaError> {
        let api = self.api;
        let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: capture of our own stream's launches, then instantiation.
        unsafe {
            check(api, "cuStreamBeginCapture", (api.stream_begin_capture)(self.stream, driver::CAPTURE_THREAD_LOCAL))?;
            let launched = self.launch_all();
            let ended = check(api, "cuStreamEndCapture", (api.stream_end_capture)(self.stream, &mut graph));
            launched?;
            ended?;
            if let Err(e) = check(api, "cuGraphInstantiate", (api.graph_instantiate)(&mut exec, graph, 0)) {
                (api.graph_destroy)(graph);
                return Err(e);
            }
        }
        Ok(Graph { graph, exec })
    }

    /// Destroys the captured graphs (call with the stream idle): before a buffer they use is
    /// replaced or freed.
    pub(super) fn clear_graphs(&mut self) {
        self.seen.clear();
        if let Some(t) = self.timing.as_mut().filter(|_| !self.graphs.is_empty()) {
            t.clears += 1;
        }
        for (_, g) in self.graphs.drain() {
            // SAFETY: graphs we created.
            unsafe {
                (self.api.graph_exec_destroy)(g.exec);
                (self.api.graph_destroy)(g.graph);
            }
        }
    }

    pub(super) fn sync(&mut self) {
        if !self.ok() {
            return;
        }
        self.current();
        // SAFETY: our stream.
        let r = unsafe { (self.api.stream_synchronize)(self.stream) };
        if let Err(e) = check(self.api, "cuStreamSynchronize", r) {
            self.fail(gpu_error(&e));
        }
    }

    pub(super) fn copy_back(&mut self, dst: *mut c_void, src: CUdeviceptr, bytes: usize) {
        if !self.ok() {
            return;
        }
        self.current();
        // SAFETY: `dst` is page-locked host memory of at least `bytes`; src a device buffer.
        let r = unsafe { (self.api.memcpy_dtoh_async)(dst, src, bytes, self.stream) };
        if let Err(e) = check(self.api, "cuMemcpyDtoHAsync", r) {
            self.fail(gpu_error(&e));
        }
    }
}

/// One recorded kernel launch: the function, its geometry and its argument bytes (each argument
/// at an 8-byte aligned offset of `args`).
pub(super) struct Launch {
    pub(super) name: String,
    pub(super) func: CUfunction,
    pub(super) grid: [u32; 3],
    pub(super) block: u32,
    pub(super) args: Vec<u64>,
    /// Start (in u64 words) of each argument in `args`.
    pub(super) offs: Vec<u32>,
}

/// Builds a launch's argument list.
pub(super) struct Args {
    pub(super) words: Vec<u64>,
    pub(super) offs: Vec<u32>,
}

impl Args {
    pub(super) fn new() -> Self {
        Args { words: Vec::with_capacity(24), offs: Vec::with_capacity(20) }
    }
    pub(super) fn ptr(mut self, p: CUdeviceptr) -> Self {
        self.offs.push(self.words.len() as u32);
        self.words.push(p);
        self
    }
    pub(super) fn i32(mut self, v: i32) -> Self {
        self.offs.push(self.words.len() as u32);
        self.words.push(v as u32 as u64);
        self
    }
    pub(super) fn i64(mut self, v: i64) -> Self {
        self.offs.push(self.words.len() as u32);
        self.words.push(v as u64);
        self
    }
    pub(super) fn f32(mut self, v: f32) -> Self {
        self.offs.push(self.words.len() as u32);
        self.words.push(v.to_bits() as u64);
        self
    }
    /// A by-value struct of `words` 8-byte words.
    pub(super) fn words(mut self, w: &[u64]) -> Self {
        self.offs.push(self.words.len() as u32);
        self.words.extend_from_slice(w);
        self
    }
}

/// A captured decode step.
pub(super) struct Graph {
    pub(super) graph: CUgraph,
    pub(super) exec: CUgraphExec,
}

/// A hash of the launches (functions, geometry, argument bytes): equal lists replay one graph.
/// A multiply-rotate hash over 64-bit words: it runs once per decode step over ~200 launches,
/// on the host while the device waits, so it must cost little; a collision would need two
/// different launch lists of one model to meet, and lists are compared only within a process.
pub(super) fn signature(ls: &[Launch]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ ls.len() as u64;
    let mut mix = |w: u64| h = (h.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    for l in ls {
        mix(l.func as u64);
        mix(u64::from(l.grid[0]) | (u64::from(l.grid[1]) << 32));
        mix(u64::from(l.grid[2]) | (u64::from(l.block) << 32));
        mix(l.args.len() as u64 | ((l.offs.len() as u64) << 32));
        for &w in &l.args {
            mix(w);
        }
        for &o in &l.offs {
            mix(u64::from(o));
        }
    }
    h | 1
}
