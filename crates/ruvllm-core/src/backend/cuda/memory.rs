//! Device and host memory: allocations freed on drop, the activation buffers, model vectors
//! uploaded once, the KV rows of each layer, and what the backend reserves for a pass.

use super::*;
use crate::backend::kv::{DeviceRows, KvRows};

/// Device memory freed on drop.
pub(super) struct DevMem {
    pub(super) ptr: CUdeviceptr,
    pub(super) bytes: usize,
    pub(super) ctx: CUcontext,
}

// SAFETY: a device address and the primary context handle are plain values usable from any
// thread once the context is made current.
unsafe impl Send for DevMem {}
// SAFETY: DevMem has no interior mutability; shared references only read the address.
unsafe impl Sync for DevMem {}

impl DevMem {
    pub(super) fn alloc(api: &'static Api, ctx: CUcontext, bytes: usize) -> std::result::Result<DevMem, CudaError> {
        let mut ptr = 0;
        // SAFETY: the context is current on this thread (set by the caller).
        unsafe { check(api, "cuMemAlloc", (api.mem_alloc)(&mut ptr, bytes.max(16)))? };
        Ok(DevMem { ptr, bytes, ctx })
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if let Ok(api) = driver::api() {
            // SAFETY: freeing memory this context allocated.
            unsafe {
                (api.ctx_set_current)(self.ctx);
                (api.mem_free)(self.ptr);
            }
        }
    }
}

/// Page-locked host memory (fast, asynchronous copies).
pub(super) struct HostMem {
    pub(super) ptr: *mut c_void,
    pub(super) bytes: usize,
    pub(super) ctx: CUcontext,
}

// SAFETY: owned host memory.
unsafe impl Send for HostMem {}

impl HostMem {
    pub(super) fn alloc(api: &'static Api, ctx: CUcontext, bytes: usize) -> std::result::Result<HostMem, CudaError> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: the context is current on this thread.
        unsafe { check(api, "cuMemAllocHost", (api.mem_alloc_host)(&mut ptr, bytes.max(16)))? };
        Ok(HostMem { ptr, bytes, ctx })
    }

    pub(super) fn as_f32(&mut self, n: usize) -> &mut [f32] {
        assert!(n * 4 <= self.bytes);
        // SAFETY: `bytes` of page-locked memory, f32-aligned.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut f32, n) }
    }

    pub(super) fn as_i32(&mut self, n: usize) -> &mut [i32] {
        assert!(n * 4 <= self.bytes);
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut i32, n) }
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        if let Ok(api) = driver::api() {
            // SAFETY: freeing what cuMemAllocHost returned.
            unsafe {
                (api.ctx_set_current)(self.ctx);
                (api.mem_free_host)(self.ptr);
            }
        }
    }
}

impl Memory for CudaBackend {
    fn describe(&self) -> String {
        format!("cuda ({}{})", self.device, if self.exact { ", exact reference mode" } else { "" })
    }
    fn threads(&self) -> usize {
        1
    }
    fn prepare_weight(&mut self, w: &QWeight) {
        self.weight(w);
    }
    fn reserve(&mut self, widths: BufWidths, max_batch: usize) {
        self.widths = widths;
        self.max_batch = max_batch;
        self.bufs.clear();
        for b in Buf::ALL {
            match self.alloc(max_batch * widths.of(b) * 4) {
                Some(m) => self.bufs.push(m),
                None => return,
            }
        }
        self.step = vec![0; 4 + 4 * max_batch];
        self.rows_part = self.alloc(max_batch * ROW_ARGMAX_PARTS * 8);
        self.rows_out = self.alloc(max_batch * 4);
        self.current();
        self.rows_host = HostMem::alloc(self.api, self.ctx, max_batch * 4).map_err(|e| self.fail(gpu_error(&e))).ok();
        self.step_dev = self.alloc(self.step.len() * 4);
        self.current();
        self.step_host = HostMem::alloc(self.api, self.ctx, 2 * self.step.len() * 4).map_err(|e| self.fail(gpu_error(&e))).ok();
        self.argmax_part = self.alloc(ARGMAX_BLOCKS.max(HEAD_BLOCKS_MAX) * 8);
        self.head_counter = self.alloc(16);
        if let Some(c) = &self.head_counter {
            // SAFETY: zero the fresh counter.
            unsafe { (self.api.memset_d8)(c.ptr, 0, 16) };
        }
        self.argmax_out = self.alloc(16);
        self.argmax_host = HostMem::alloc(self.api, self.ctx, 16).map_err(|e| self.fail(gpu_error(&e))).ok();
        self.lr_tmp = self.alloc(max_batch * 64 * 4);
        self.x2 = self.alloc(max_batch * widths.d_model * 4);
        let widest = widths.d_model.max(widths.q_dim).max(widths.ff_dim);
        self.act_buf = self.alloc(max_batch * widest * 4);
    }
    fn max_batch(&self) -> usize {
        self.max_batch
    }
    fn prefers_merged_adapters(&self) -> bool {
        // The reference mode runs what the CPU runs.
        !self.exact
    }
    fn new_layer_cache(&self, capacity: usize, row: usize, ty: KvType) -> LayerCache {
        // The engine opens no CUDA backend for a q8_0 cache (`open_cuda`).
        assert!(ty != KvType::Q8_0, "the CUDA backend has no q8_0 KV cache");
        let elem = if ty == KvType::F16 { 2 } else { 4 };
        let bytes = capacity * row * elem;
        self.current();
        let (k, v) = match (DevMem::alloc(self.api, self.ctx, bytes), DevMem::alloc(self.api, self.ctx, bytes)) {
            (Ok(k), Ok(v)) => (k, v),
            // Reported at the first pass (see `attention`): a cache of null rows.
            _ => return LayerCache { capacity, rows: KvRows::Device(DeviceRows::new(0, 0, elem, 0, Box::new(|| {}))) },
        };
        // SAFETY: zero the fresh rows.
        unsafe {
            (self.api.memset_d8)(k.ptr, 0, bytes);
            (self.api.memset_d8)(v.ptr, 0, bytes);
        }
        let (kp, vp) = (k.ptr, v.ptr);
        LayerCache { capacity, rows: KvRows::Device(DeviceRows::new(kp, vp, elem, 2 * bytes, Box::new(move || drop((k, v))))) }
    }
    fn finish(&mut self) {
        self.flush();
        self.sync();
    }
    fn status(&mut self) -> Result<()> {
        match self.error.take() {
            None => Ok(()),
            Some(e) => {
                // The pass's results are void; the next pass starts clean.
                self.pending.clear();
                self.picks.clear();
                self.pending_res = None;
                Err(e)
            }
        }
    }
}

impl CudaBackend {
    /// Overwrites the first rows of buffer `b` with `data`, after the work sent so far (op-level
    /// tests across backends).
    #[doc(hidden)]
    pub fn write_buf(&mut self, b: Buf, data: &[f32]) {
        self.flush();
        self.sync();
        let p = self.buf(b);
        // SAFETY: reinterpreting f32s as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, data.len() * 4) };
        if p != 0 && data.len() <= self.max_batch * self.widths.of(b) {
            self.upload(p, bytes);
        }
    }
    /// The first `n` rows of buffer `b` once the work sent so far is done (op-level tests across
    /// backends); empty after a failure.
    #[doc(hidden)]
    pub fn read_buf(&mut self, b: Buf, n: usize) -> Vec<f32> {
        self.flush();
        self.sync();
        let len = (n * self.widths.of(b)).min(self.max_batch * self.widths.of(b));
        let mut out = vec![0f32; len];
        let src = self.buf(b);
        if self.ok() && src != 0 {
            self.current();
            // SAFETY: a copy of `len` floats into our vector, waited for below.
            let r = unsafe { (self.api.memcpy_dtoh_async)(out.as_mut_ptr() as *mut c_void, src, len * 4, self.stream) };
            if let Err(e) = check(self.api, "cuMemcpyDtoH", r) {
                self.fail(gpu_error(&e));
            }
            self.sync();
        }
        if self.ok() {
            out
        } else {
            Vec::new()
        }
    }
    /// The widest input of a product (the activation buffer holds `max_batch` of them).
    pub(super) fn widest(&self) -> usize {
        self.widths.d_model.max(self.widths.q_dim).max(self.widths.ff_dim)
    }
    /// Device memory in use and total, in bytes.
    pub fn memory(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        self.current();
        // SAFETY: out-parameters.
        unsafe { (self.api.mem_get_info)(&mut free, &mut total) };
        (total - free, total)
    }
    pub(super) fn alloc(&mut self, bytes: usize) -> Option<DevMem> {
        self.current();
        match DevMem::alloc(self.api, self.ctx, bytes) {
            Ok(m) => Some(m),
            Err(e) => {
                self.fail(gpu_error(&e));
                None
            }
        }
    }
    pub(super) fn upload(&mut self, dst: CUdeviceptr, src: &[u8]) {
        self.current();
        // SAFETY: `dst` holds at least `src.len()` bytes (allocated for it).
        let r = unsafe { (self.api.memcpy_htod)(dst, src.as_ptr() as *const c_void, src.len()) };
        if let Err(e) = check(self.api, "cuMemcpyHtoD", r) {
            self.fail(gpu_error(&e));
        }
    }
    /// A layer's KV rows in device memory (recording the failure when they are not).
    pub(super) fn device_rows<'c>(&mut self, cache: &'c LayerCache) -> Option<&'c DeviceRows> {
        match &cache.rows {
            KvRows::Device(d) if d.k != 0 => Some(d),
            KvRows::Device(_) => {
                self.fail(Error::Gpu { code: "ERR_GPU_OOM", msg: "out of GPU memory for the KV cache".into() });
                None
            }
            _ => {
                self.fail(Error::Internal("the CUDA backend was given a host KV cache".into()));
                None
            }
        }
    }
    pub(super) fn ptr_of(m: &Option<DevMem>) -> CUdeviceptr {
        m.as_ref().map_or(0, |m| m.ptr)
    }
    pub(super) fn buf(&self, b: Buf) -> CUdeviceptr {
        if b == Buf::X && self.x_alt {
            return Self::ptr_of(&self.x2);
        }
        self.bufs.get(b.index()).map_or(0, |m| m.ptr)
    }
    /// A host f32 slice in device memory, uploaded on first use (model vectors live as long as
    /// the model, which outlives the backend's use of them).
    pub(super) fn vector(&mut self, v: &[f32]) -> CUdeviceptr {
        let key = (v.as_ptr() as usize, v.len());
        if let Some(m) = self.vectors.get(&key) {
            return m.ptr;
        }
        self.upload_vector(key, v)
    }
    /// Uploads `v` into new device memory kept under `key` in `vectors`.
    pub(super) fn upload_vector(&mut self, key: (usize, usize), v: &[f32]) -> CUdeviceptr {
        let Some(m) = self.alloc(v.len() * 4) else { return 0 };
        // SAFETY: reinterpreting f32s as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4) };
        self.upload(m.ptr, bytes);
        let p = m.ptr;
        self.vectors.insert(key, m);
        p
    }
    /// [`vector`](Self::vector) for a slice that may not outlive the model: keyed by its values.
    pub(super) fn vector_by_content(&mut self, v: &[f32]) -> CUdeviceptr {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for x in v {
            x.to_bits().hash(&mut h);
        }
        let key = (h.finish() as usize | 1, usize::MAX - v.len());
        if let Some(m) = self.vectors.get(&key) {
            return m.ptr;
        }
        self.upload_vector(key, v)
    }
}
