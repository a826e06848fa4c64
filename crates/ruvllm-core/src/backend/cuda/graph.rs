//! Sending the recorded launches: as they are, timed one by one (`RUVLLM_CUDA_PROFILE`), or
//! as a CUDA graph captured the second time a list is seen; and the synchronisation around them.

use super::*;

impl CudaBackend {
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
            let graphable = self.graphs_on && (self.step[1] == 1 || self.segs.is_some_and(|p| p.decode));
            let sig = if graphable { signature(&self.pending) } else { 0 };
            if graphable {
                if let Some(g) = self.graphs.get(&sig) {
                    let exec = g.exec;
                    return self.launch_graph(exec);
                }
                if sig == self.last_sig {
                    let g = self.capture()?;
                    self.launch_graph(g.exec)?;
                    if self.graphs.len() >= 16 {
                        self.clear_graphs();
                    }
                    self.graphs.insert(sig, g);
                    return Ok(());
                }
                self.last_sig = sig;
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
        self.last_sig = 0;
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
