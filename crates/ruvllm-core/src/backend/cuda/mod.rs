//! The CUDA backend: the [`Backend`] operations as our own kernels (`kernels.cu`, compiled by
//! nvcc at build time and embedded), run through the driver API loaded at run time
//! ([`driver`]), so one binary serves machines with and without a GPU.
//!
//! - Weights are uploaded once in their GGUF block formats and dequantized in registers by the
//!   products (`products.rs`: one token on `mmv1s`, or `mmvq4` in models ≥ 768 wide; 2–16 on
//!   `mmvq*` where MMQ would leave multiprocessors idle; more on the int8 tensor-core `mmq*`
//!   kernels for Q8_0/Q5_0/Q4_0/Q4_K/Q6_K, the FP32 tiles `gemm_*` for the other types).
//! - Several sequences run in one pass (`begin_segments`; `attention.rs`): their rows' positions
//!   and KV caches in the step block, one attention launch per layer for all of them. Their
//!   greedy picks (`argmax_rows`) or best 64 logits (`top_logits`, for sampling) are found on
//!   the device (`head.rs`).
//! - Operations are recorded, not launched: a forward pass becomes a list of kernel launches,
//!   sent at the first point the host needs a result (the LM head's token or logits, a hidden
//!   state). What changes between decode steps (position, tokens, LM-head rows) lives in a small
//!   device "step" block, so two decode steps make the same list; the second time a list is
//!   seen it is captured as a CUDA graph and replayed from then on: one launch per token.
//! - Greedy decoding reads back one token id ([`DevicePicks::argmax`](crate::backend::DevicePicks::argmax)); the logits come back only
//!   when the sampler needs them.
//! - Failures (a launch, a copy, out of device memory) are kept and reported by
//!   [`Memory::status`](crate::backend::Memory::status) as coded errors; nothing panics across the API.

mod attention;
mod device;
pub mod driver;
mod graph;
mod head;
mod memory;
mod products;
mod reference;
mod weights;

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::hash::{Hash, Hasher};

use driver::{check, Api, CUcontext, CUdeviceptr, CUfunction, CUgraphExec, CUmodule, CUstream, CudaError};

use super::{
    Activation, AttentionMask, AttnShape, Backend, Buf, BufWidths, DevicePicks, KvType, LayerCache, LowRankTerms, Memory, PickQueue, QWeight, QkNorms,
    RopeStyle, RopeTable, Span, TOP_LOGITS,
};
use crate::backend::cpu::GgmlType;
use crate::{Error, Result};
use graph::{Args, Graph, Launch};
use memory::{DevMem, HostMem};
use weights::{act_kernel, supports, type_suffix, DevWeight};

/// The kernels, compiled for sm_80 and sm_90 plus PTX (see build.rs).
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ruvllm_kernels.fatbin"));

const MMV_MAX: usize = 8;
/// MMQ grids of at most this many blocks run two warp groups per tile (`mmq_launch`).
const MMQ_FEW_BLOCKS: usize = 132;
/// Most splits of a decode step's attention span (fixed, so the step's launches do not change;
/// the kernel uses fewer while the span is short).
const DECODE_SPLITS: usize = 32;
/// Most splits of a prefill token's span.
const PREFILL_SPLITS: usize = 4;
/// A many-token attention launch splits spans only while it has fewer (query, KV head) blocks
/// than this (two per multiprocessor of an H100/H200).
const ATT_FILL_BLOCKS: usize = 264;
/// Shortest slice of a span the attention kernel gives one block (`ATT_MIN_CHUNK`).
const ATT_MIN_CHUNK: usize = 32;
/// A decode attention slice's fewest positions: short spans spread over more blocks (fewer
/// positions per slice cost more combining than they save).
const DECODE_ATT_CHUNK: usize = 16;
const ARGMAX_BLOCKS: usize = 256;
/// Where in `argmax_out` a queued pick is kept for a pass that takes it as its token (the
/// kernels write element 0).
const PICK_OFFSET: u64 = 8;
/// Step block word 3 (flags): the pass's LM head also writes its pick at `PICK_OFFSET` (a queued
/// pick), and the pass's token is read from there (it takes the last queued pick).
const STEP_KEEP_PICK: i32 = 1;
const STEP_TOKEN_PICK: i32 = 2;
/// The one-token LM head over Q8_0 (`head_q8_0r`): blocks of its persistent grid (the fastest of
/// 528–4,096 tried), rows per block step, widest input.
const HEAD_BLOCKS: usize = 2048;
/// The most blocks `RUVLLM_CUDA_HEAD_BLOCKS` may ask for (the candidates' buffer is sized for it).
const HEAD_BLOCKS_MAX: usize = 8192;
const HEAD_TILE: usize = 32;
const HEAD_MAX_COLS: usize = 2048;
/// `head2_q8_0r_<chunks>`, the one-token LM head read in 16-byte pieces (`RUVLLM_CUDA_HEAD2=0`
/// keeps `head_q8_0r`): its persistent grid is this many blocks per multiprocessor
/// (`RUVLLM_CUDA_HEAD2_BLOCKS` sets the whole grid), for inputs of at most this many 256-wide
/// chunks.
const HEAD2_PER_SM: usize = 3;
const HEAD2_MAX_CHUNKS: usize = 8;
/// Widest input of the one-token products that stage it in shared memory (`mmv1s`, `mmvg1s`).
const MMV1_MAX_COLS: usize = 4096;
/// Step-block words of one `SegKv` (kernels.cu): K and V pointers, capacity, f16 flag.
const SEG_KV_WORDS: usize = 6;
/// Captured steps kept before all are dropped: one per batch size of decode steps (1–16
/// sequences, the run-ahead pass beside the one-sequence one) and per (rows, head rows) of a
/// diffusion step (up to ~45 with blocks of 8).
const MAX_GRAPHS: usize = 128;
/// Passes of at most this many rows are captured as graphs when their launch list comes back
/// (decode steps, diffusion steps, short prompts): their launches name no position (the
/// attention takes a fixed split count, see `attention_launch`).
const GRAPH_ROWS: usize = 32;
/// Most launch lists remembered as seen once.
const MAX_SEEN: usize = 512;
/// The most tokens the decode-batch products (`mmvq*`) take, and the most 64-row MMQ tiles a
/// product of up to 4 tokens may have for them (an LM head's 262,144 rows read through `mmvq`
/// would read the activations once per row: MMQ).
const MMVQ_MAX: usize = 16;
const MMVQ_TILES: usize = 1024;
/// Models at least this wide run their one-token products on `mmvq` too (`one_token_mmvq`).
const MMVQ1_WIDTH: usize = 768;
/// Candidates per row of a many-row greedy pick (`argmax1` grid (parts, rows)).
const ROW_ARGMAX_PARTS: usize = 64;
/// `top1`'s slice of a row and `top2`'s lists per block (kernels.cu `TOP_SLICE`).
const TOP_SLICE: usize = 2048;
/// Blocks per row of `row_lse` (each ~8,000 logits of a 262,144-token vocabulary).
const LSE_PARTS: usize = 32;
const TOP_MERGE: usize = TOP_SLICE / TOP_LOGITS;

/// Whether the CUDA kernels run a model with these weights, attention shape, width and KV
/// cache type; `Err` says why not (the backend decides what it supports, not its caller).
pub fn check_model<'w>(mut weights: impl Iterator<Item = &'w QWeight>, shape: AttnShape, d_model: usize, kv: KvType) -> std::result::Result<(), String> {
    if kv == KvType::Q8_0 {
        return Err("the CUDA attention kernel reads f16 or f32 KV caches, not q8_0".into());
    }
    if let Some(w) = weights.find(|w| !supports(w.ty, w.cols)) {
        return Err(format!("the CUDA kernels do not run this model's {} weights ({} columns)", w.ty.name(), w.cols));
    }
    if shape.softcap.is_some() {
        return Err("the CUDA attention kernel has no attention-score soft-capping".into());
    }
    attention_fits(shape)?;
    if d_model > 16 * 256 {
        return Err(format!("the CUDA kernels take models at most 4,096 wide, not {d_model}"));
    }
    Ok(())
}

/// Whether the attention kernel covers this shape (head_dim ≤ 256, a multiple of 32; 1–8 query
/// heads per KV head); `Err` says why not.
fn attention_fits(shape: AttnShape) -> std::result::Result<(), String> {
    let group = shape.n_head / shape.n_kv_head.max(1);
    if shape.head_dim > 256 || !shape.head_dim.is_multiple_of(32) || group == 0 || group > 8 {
        return Err(format!("the CUDA attention kernel does not cover head_dim {} with {group} heads per KV head", shape.head_dim));
    }
    Ok(())
}

/// Why the GPU cannot be used, as the coded error `gpu: 'cuda'` reports.
pub fn unavailable(msg: impl Into<String>) -> Error {
    Error::Gpu { code: "ERR_GPU_UNAVAILABLE", msg: msg.into() }
}

fn gpu_error(e: &CudaError) -> Error {
    if e.out_of_memory() {
        Error::Gpu { code: "ERR_GPU_OOM", msg: format!("out of GPU memory: {e}") }
    } else {
        Error::Gpu { code: "ERR_GPU", msg: format!("GPU failure: {e}") }
    }
}

/// The `Mmv3` struct of kernels.cu: three (weight, row bytes, rows, output) sets.
fn mmv3_words(w: [CUdeviceptr; 3], rb: [i64; 3], rows: [i32; 3], y: [CUdeviceptr; 3]) -> [u64; 11] {
    let r = |i: usize| rows[i] as u32 as u64;
    [w[0], w[1], w[2], rb[0] as u64, rb[1] as u64, rb[2] as u64, r(0) | (r(1) << 32), r(2), y[0], y[1], y[2]]
}

/// A deferred residual step (see `CudaBackend::pending_res`): its norm weights and epsilon.
#[derive(Clone, Copy)]
struct PendingRes {
    post: CUdeviceptr,
    next: CUdeviceptr,
    eps: f32,
}

/// Device time of graph replays (see `CudaBackend::timing`).
struct Timing {
    /// Start events of the last two replays (`cur` the last's): the device time from one
    /// replay's start to the next's, gaps between replays included.
    start: [driver::CUevent; 2],
    cur: usize,
    starts_us: Vec<f32>,
    end: driver::CUevent,
    pending: bool,
    replays: u64,
    gpu_ms: f64,
    last: Option<std::time::Instant>,
    periods: u64,
    period_s: f64,
    /// Graphs captured (and the host time it took), graph caches dropped, and decode steps
    /// sent launch by launch (no graph for their list yet).
    captures: u64,
    capture_s: f64,
    clears: u64,
    uncaptured: u64,
}

/// A pass of several sequences, or one sequence's one-token step (staged by `begin_segments`,
/// taken by the next `embed`): each row's position and sequence sit in the step block after the
/// LM-head rows, then one `SegKv` per (layer, sequence), filled as `segment_attention` is called
/// for each sequence in turn; the call for a layer's last sequence launches that layer's
/// QK-norm/RoPE/store and attention over every row at once.
#[derive(Clone, Copy)]
struct SegPass {
    segs: usize,
    rows: usize,
    layers: usize,
    /// Every sequence carries one token (a batched decode step: one graph per sequence count).
    decode: bool,
    /// One past the furthest position of any row (the longest span).
    end: usize,
    /// `segment_attention` calls so far.
    calls: usize,
}

/// A layer's KV rows on the device: K, V, whether f16, capacity in positions.
#[derive(Clone, Copy)]
struct KvRef {
    k: CUdeviceptr,
    v: CUdeviceptr,
    f16: bool,
    capacity: usize,
}

/// The CUDA backend (see the module docs).
pub struct CudaBackend {
    api: &'static Api,
    ctx: CUcontext,
    stream: CUstream,
    #[allow(dead_code)]
    module: CUmodule,
    funcs: HashMap<String, CUfunction>,
    device: String,
    widths: BufWidths,
    max_batch: usize,
    bufs: Vec<DevMem>,
    /// Step block: [pos0, n, rows, _, tokens.., head rows..].
    step_dev: Option<DevMem>,
    /// Two host copies of the step block, used in turn: a pass's upload may still be in flight
    /// while the next pass is recorded (`step_ev[k]` marks slot k's upload done).
    step_host: Option<HostMem>,
    step: Vec<i32>,
    segs: Option<SegPass>,
    segs_next: Option<SegPass>,
    /// Many-row greedy picks: candidates, one id per row, and their host copy.
    rows_part: Option<DevMem>,
    rows_out: Option<DevMem>,
    rows_host: Option<HostMem>,
    /// `top_logits`: the lists of the two stages (values then ids, twice) and the host copy.
    top_dev: Option<DevMem>,
    top_host: Option<HostMem>,
    step_slot: usize,
    step_ev: [driver::CUevent; 2],
    /// Queued greedy picks (see `PickQueue::queue_pick`): host slots 1 and 2 of `argmax_host`,
    /// oldest first, each with the event that marks its copy done.
    picks: std::collections::VecDeque<usize>,
    pick_ev: [driver::CUevent; 2],
    /// The next pass takes its token from the last queued pick (`embed_last_pick`), and
    /// whether the pass being recorded does.
    embed_pick: bool,
    pass_pick: bool,
    /// The kernels move picks themselves (step flags, see `STEP_KEEP_PICK`) instead of two
    /// 4-byte device copies per greedy token (`RUVLLM_CUDA_PICK_KERNEL=0` keeps the copies).
    pick_kernel: bool,
    /// Picks may be queued (`RUVLLM_CUDA_AHEAD=0` turns it off, for A/B runs: every greedy
    /// token then waits for its pick before the next pass is sent).
    ahead_on: bool,
    /// The fewest cache positions a decode attention slice takes (`RUVLLM_CUDA_ATT_CHUNK`,
    /// default `DECODE_ATT_CHUNK`): fewer positions per slice, more blocks on a short span.
    att_chunk: usize,
    /// Most tokens a layer product runs on the one-row kernels (`mmv*`; more: MMQ), and most
    /// rows an LM head does (`RUVLLM_CUDA_MMV_MAX`, `RUVLLM_CUDA_HEAD_MMV_MAX`, 1..=8): the
    /// `mmv` kernels read the f32 activations once per weight row, which over a 262,144-row
    /// head costs more than the weights, so several rows go to MMQ.
    mmv_max: usize,
    head_mmv_max: usize,
    /// Decode-size batches of MMQ types on `mmvq*` (`RUVLLM_CUDA_MMVQ=0`: MMQ).
    mmvq: bool,
    /// One-token products of models at least this wide on `mmvq4` too
    /// (`RUVLLM_CUDA_MMVQ1=<width>`, 0: none; see `one_token_mmvq`): `mmv1s` reads f32
    /// activations and suits narrow rows (Gemma 3 270M's 640), the int8 `mmvq4` wider ones.
    mmvq1_width: usize,
    /// Attention with 5-8 query heads per KV head on `attention_g8n` unless a folded QK step
    /// needs `attention` (`RUVLLM_CUDA_ATT_G8N=0`: always `attention`).
    att_g8n: bool,
    /// The one-token LM head's persistent grid (`RUVLLM_CUDA_HEAD_BLOCKS`, default
    /// `HEAD_BLOCKS`).
    head_blocks: usize,
    /// The one-token LM head computes its row's final norm itself (one launch fewer;
    /// `RUVLLM_CUDA_FUSE_HEAD=0` keeps `norm_rows`).
    fuse_head: bool,
    /// The one-token LM head over Q8_0 runs `head2_q8_0r_*` on this grid, or `head_q8_0r` when
    /// `None` (`RUVLLM_CUDA_HEAD2=0`).
    head2_blocks: Option<usize>,
    /// Many-token products of Q8_0 / Q5_0 / Q4_0 weights on the int8 tensor cores
    /// (`RUVLLM_CUDA_MMA=1`; off by default: each 32-block's integer tile is scaled through
    /// shared memory, which left it barely faster than the FP32 tiles; `mmq` scales in
    /// registers, as llama.cpp's MMQ does, and takes precedence).
    mma: bool,
    /// Many-token products of Q8_0 / Q5_0 / Q4_0 / Q4_K / Q6_K weights by the MMQ kernels
    /// (int8 `mma.sync`, every 32-block's integer sum scaled in registers; up to three weights
    /// of one type in one launch); on by default, `RUVLLM_CUDA_MMQ=0` for the FP32 tiles; takes
    /// precedence over `mma`. They match a float64 product to 3.4e-7 at every token count
    /// tried (scripts/mmq-test.cu `check`); which greedy prompts part from the CPU's at a
    /// near-tie depends on which kernels computed each row, as it does between the CPU's own
    /// paths (BENCHMARKS, GPU).
    mmq: bool,
    /// `RUVLLM_CUDA_MMQ_TYPES=q5_0,q4_k,..`: MMQ only for those weight types (A/B runs).
    mmq_types: Option<String>,
    /// Most splits of a many-token pass's attention span (`RUVLLM_CUDA_PREFILL_SPLITS`, 1-32,
    /// for A/B runs; default: see `attention_launch`).
    prefill_splits: Option<usize>,
    logits_dev: Option<DevMem>,
    logits_host: Option<HostMem>,
    /// Rows of the last LM head, and whether `logits_host` holds them.
    head_rows: usize,
    logits_ready: bool,
    argmax_part: Option<DevMem>,
    argmax_out: Option<DevMem>,
    argmax_host: Option<HostMem>,
    att_part: Option<DevMem>,
    att_counters: Option<DevMem>,
    lr_tmp: Option<DevMem>,
    /// Rounded activations for the tiled product (max_batch × the widest input).
    act_buf: Option<DevMem>,
    hidden_host: Vec<f32>,
    weights: HashMap<(usize, usize), DevWeight>,
    /// Host vectors uploaded once (norm weights, biases, RoPE tables, LoRA factors), by
    /// (address, length) or by LoRA id.
    vectors: HashMap<(usize, usize), DevMem>,
    lora: HashMap<u64, (DevMem, DevMem)>,
    pending: Vec<Launch>,
    graphs: HashMap<u64, Graph>,
    /// Launch lists seen once and not captured yet (a list is captured the second time).
    seen: std::collections::HashSet<u64>,
    graphs_on: bool,
    /// `RUVLLM_CUDA_PROFILE=1`: time every kernel with events (no graphs), report at drop.
    profile: Option<HashMap<String, (u64, f64)>>,
    /// Launch with programmatic dependent launch (sm_90 and newer; `RUVLLM_CUDA_PDL=0` turns it
    /// off, `RUVLLM_CUDA_PDL=decode` keeps it to one-token passes): each kernel starts while the
    /// one before finishes and fetches its weights meanwhile.
    pdl: bool,
    pdl_decode_only: bool,
    /// The one-token LM head's count of finished blocks (zero between launches).
    head_counter: Option<DevMem>,
    /// `RUVLLM_CUDA_TIMING=1`: device time of each replayed decode graph against the host time
    /// between replays, reported at drop.
    timing: Option<Timing>,
    /// A one-token residual step not launched yet: the product that reads its normed output
    /// computes it in its own blocks (one launch fewer), else `push` launches it first.
    pending_res: Option<PendingRes>,
    /// Fold a one-token residual step into the next product (on unless `RUVLLM_CUDA_FUSE` is `0`
    /// or `qk`), and a one-token QK-norm, RoPE and KV store into the attention kernel (only with
    /// `RUVLLM_CUDA_FUSE=qk` or `all`: it makes the attention kernel slower by more than the
    /// launch it saves).
    fuse_res: bool,
    fuse_qk: bool,
    /// The residual stream lives in `x2` instead of `Buf::X` (a folded residual step writes
    /// the other buffer; see `Res` in kernels.cu).
    x_alt: bool,
    x2: Option<DevMem>,
    /// `RUVLLM_CUDA_CARVEOUT=<percent>`: one shared-memory carveout for every kernel (so the
    /// multiprocessors need not reconfigure L1 between kernels of different needs).
    carveout: Option<i32>,
    /// `RUVLLM_CUDA_EXACT=1`: the reference mode (`reference.cu`): every operation as the CPU's
    /// scalar reference path does it, in its order, so the logits equal the CPU's
    /// (`RUVLLM_FORCE_SCALAR=1`, or the portable kernels) bit for bit. No fusion, graphs, MMQ or
    /// PDL; one thread per output element: a correctness tool, many times slower.
    exact: bool,
    /// The reference attention's score rows (n × heads × span), grown on use.
    ref_scores: Option<DevMem>,
    error: Option<Error>,
}

// SAFETY: the raw handles are process-wide driver objects; the backend is used by one thread at
// a time (it is `Send`, not `Sync`) and makes its context current before driver calls.
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    fn current(&self) {
        // SAFETY: our retained primary context.
        unsafe { (self.api.ctx_set_current)(self.ctx) };
    }

    fn fail(&mut self, e: Error) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    fn ok(&self) -> bool {
        self.error.is_none()
    }

    fn func(&mut self, name: &str) -> CUfunction {
        if let Some(&f) = self.funcs.get(name) {
            return f;
        }
        let mut f = std::ptr::null_mut();
        let c = CString::new(name).unwrap();
        // SAFETY: module loaded in `new`; the names are the kernels' extern "C" names.
        let r = unsafe { (self.api.module_get_function)(&mut f, self.module, c.as_ptr()) };
        if let Err(e) = check(self.api, "cuModuleGetFunction", r) {
            self.fail(Error::Gpu { code: "ERR_GPU", msg: format!("kernel {name}: {e}") });
        } else if let Some(pct) = self.carveout {
            // SAFETY: a function of our module; a preference the driver may round or ignore.
            unsafe { (self.api.func_set_attribute)(f, driver::FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, pct) };
        }
        self.funcs.insert(name.to_string(), f);
        f
    }

    /// Launches the deferred residual step, if any, as its own kernel (in place).
    fn settle(&mut self) {
        if let Some(r) = self.pending_res.take() {
            self.residual_kernel(r, 1);
        }
    }

    fn residual_kernel(&mut self, r: PendingRes, n: usize) {
        let d = self.widths.d_model;
        let args = Args::new().ptr(self.buf(Buf::X)).ptr(self.buf(Buf::Proj)).ptr(self.buf(Buf::Xn)).ptr(r.post).ptr(r.next).i32(d as i32).f32(r.eps);
        let block = (d.div_ceil(32) * 32).clamp(32, 256) as u32;
        self.push("residual_norm", [n as u32, 1, 1], block, args);
    }

    /// The `Res` argument of the one-token products: the deferred residual step folded into
    /// this launch (moving the residual to the other buffer), or off.
    fn take_res(&mut self, src: Buf, cols: usize) -> [u64; 7] {
        let Some(r) = self.pending_res else { return [0; 7] };
        if src != Buf::Xn || cols != self.widths.d_model || r.next == 0 || cols > MMV1_MAX_COLS {
            return [0; 7];
        }
        self.pending_res = None;
        let (x, p, xn) = (self.buf(Buf::X), self.buf(Buf::Proj), self.buf(Buf::Xn));
        self.x_alt = !self.x_alt;
        let xo = self.buf(Buf::X);
        [x, p, r.post, r.next, xo, xn, r.eps.to_bits() as u64 | (1u64 << 32)]
    }

    /// Words of the step block a flush uploads: the multi-sequence tables only when in use.
    fn step_words(&self) -> usize {
        let mb = self.max_batch;
        match self.segs {
            Some(p) => 4 + 4 * mb + p.layers * p.segs * SEG_KV_WORDS,
            None => 4 + 2 * mb,
        }
    }

    /// The one-row product instance (`mmv{1,2,4,8}_*`) for `n` ≤ `MMV_MAX` tokens.
    fn mmv_tokens(n: usize) -> usize {
        match n {
            1 => 1,
            2 => 2,
            3 | 4 => 4,
            _ => 8,
        }
    }

    /// Sets the step's position and token count (flushing a previous pass first).
    fn begin_pass(&mut self, pos0: usize, n: usize) {
        self.step[0] = pos0 as i32;
        self.step[1] = n as i32;
    }
}

impl Backend for CudaBackend {
    fn runs_segments(&self) -> bool {
        // The reference mode keeps the CPU's order of operations: one sequence per pass.
        !self.exact
    }

    fn begin_segments(&mut self, segs: &[(usize, usize)], layers: usize, mask: AttentionMask) {
        self.segs_next = None;
        // One sequence takes the table only for a causal one-token step (a decode step); the
        // table path runs causal passes only.
        if self.exact || mask != AttentionMask::Causal || segs.is_empty() || (segs.len() == 1 && segs[0].1 != 1) {
            return;
        }
        // The previous pass is sent with the step block as it was.
        self.flush();
        let mb = self.max_batch;
        let rows: usize = segs.iter().map(|s| s.1).sum();
        let need = 4 + 4 * mb + layers * segs.len() * SEG_KV_WORDS;
        if rows > mb {
            return self.fail(Error::Internal(format!("a pass of {rows} rows (max {mb})")));
        }
        if self.step.len() < need {
            // Captured graphs and host slots point at the blocks being replaced.
            self.sync();
            self.clear_graphs();
            self.step.resize(need, 0);
            self.step_dev = self.alloc(need * 4);
            self.current();
            self.step_host = HostMem::alloc(self.api, self.ctx, 2 * need * 4).map_err(|e| self.fail(gpu_error(&e))).ok();
        }
        let base = 4 + 2 * mb;
        let mut t = 0;
        for (k, &(pos0, n)) in segs.iter().enumerate() {
            for i in 0..n {
                self.step[base + 2 * t] = (pos0 + i) as i32;
                self.step[base + 2 * t + 1] = k as i32;
                t += 1;
            }
        }
        let end = segs.iter().map(|s| s.0 + s.1).max().unwrap_or(0);
        self.segs_next = Some(SegPass { segs: segs.len(), rows, layers, decode: segs.iter().all(|s| s.1 == 1), end, calls: 0 });
    }

    fn embed(&mut self, table: &QWeight, tokens: &[u32], scale: Option<f32>, replace: Option<(u32, &[f32])>) {
        // A new pass: send what the previous one left (its LM head), then set the step.
        self.flush();
        self.x_alt = false;
        self.segs = self.segs_next.take();
        let n = tokens.len();
        if self.segs.is_some() {
            self.step[0] = 0;
        }
        self.pass_pick = self.embed_pick && n == 1;
        self.step[3] = if self.pass_pick && self.pick_kernel { STEP_TOKEN_PICK } else { 0 };
        self.step[1] = n as i32;
        for (i, &t) in tokens.iter().enumerate() {
            self.step[4 + i] = t as i32;
        }
        let Some((wp, rb)) = self.weight(table) else { return };
        let (rp, rid) = match replace {
            // Keyed by content: an adapter's row may be freed and another take its address.
            Some((id, r)) if r.len() == self.widths.d_model => (self.vector_by_content(r), id as i32),
            _ => (0, -1),
        };
        let name = format!("embed_{}", type_suffix(table.ty).unwrap_or("f32"));
        let step = Self::ptr_of(&self.step_dev);
        let pick = Self::ptr_of(&self.argmax_out) + PICK_OFFSET;
        if self.exact {
            // The CPU's `dequantize` then `· scale`, element by element.
            let Some(suffix) = self.ref_suffix(table.ty, "embeddings") else { return };
            let d = self.widths.d_model;
            let args = Args::new().ptr(wp).i64(rb as i64).ptr(step).ptr(self.buf(Buf::X)).i32(d as i32).f32(scale.unwrap_or(1.0)).ptr(rp).i32(rid).ptr(pick);
            self.push(&format!("ref_embed_{suffix}"), [Self::blocks(d, 128), n as u32, 1], 128, args);
            return;
        }
        let args = Args::new()
            .ptr(wp)
            .i64(rb as i64)
            .ptr(step)
            .ptr(self.buf(Buf::X))
            .i32(self.widths.d_model as i32)
            .f32(scale.unwrap_or(1.0))
            .ptr(rp)
            .i32(rid)
            .ptr(pick);
        self.push(&name, [n as u32, 1, 1], 256, args);
    }

    fn rms_norm(&mut self, src: Buf, dst: Buf, w: &[f32], eps: f32, n: usize) {
        let chunks = n * self.widths.of(src) / w.len();
        let wp = self.vector(w);
        let args = Args::new().ptr(self.buf(src)).ptr(self.buf(dst)).ptr(wp).i32(w.len() as i32).f32(eps).i32(chunks as i32);
        if self.exact {
            self.push("ref_rms_norm", [Self::blocks(chunks, 64), 1, 1], 64, args);
            return;
        }
        self.push("rms_norm", [chunks as u32, 1, 1], 256, args);
    }

    fn matmul(&mut self, w: &QWeight, src: Buf, dst: Buf, n: usize) {
        self.products(&[w], src, &[dst], n);
    }

    fn matmul_fused(&mut self, ws: &[&QWeight], src: Buf, dsts: &[Buf], n: usize) {
        self.products(ws, src, dsts, n);
    }

    fn add_bias(&mut self, dst: Buf, bias: &[f32], n: usize) {
        let count = n * bias.len();
        let bp = self.vector(bias);
        self.push("add_bias", [Self::blocks(count, 256), 1, 1], 256, Args::new().ptr(self.buf(dst)).ptr(bp).i32(bias.len() as i32).i32(count as i32));
    }

    fn add_biases(&mut self, items: &[(Buf, &[f32])], n: usize) {
        if self.exact || items.len() > 3 {
            for &(dst, bias) in items {
                self.add_bias(dst, bias, n);
            }
            return;
        }
        // Up to three in one launch (a model with q/k/v biases: two launches fewer per layer).
        let mut args = Args::new();
        let mut count = 0;
        for k in 0..3 {
            let (dst, bp, width) = match items.get(k) {
                Some(&(dst, bias)) => (self.buf(dst), self.vector(bias), bias.len()),
                None => (0, 0, 0),
            };
            args = args.ptr(dst).ptr(bp).i32(width as i32);
            count += n * width;
        }
        self.push("add_bias3", [Self::blocks(count, 256), 1, 1], 256, args.i32(n as i32));
    }

    fn add_low_rank(&mut self, terms: &LowRankTerms, src: Buf, dsts: &[Buf], n: usize) {
        let tmp = Self::ptr_of(&self.lr_tmp);
        let x = self.buf(src);
        for (k, f, scale) in terms.iter() {
            if f.rank * n > self.max_batch * 64 {
                self.fail(Error::Gpu { code: "ERR_GPU", msg: format!("adapter rank {} is above the CUDA backend's 64", f.rank) });
                return;
            }
            let key = if f.id != 0 { f.id } else { content_id(f.a, f.bt) };
            if !self.lora.contains_key(&key) {
                if self.lora.len() > 4096 {
                    self.flush();
                    self.sync();
                    self.clear_graphs();
                    self.lora.clear();
                }
                let (Some(a), Some(b)) = (self.alloc(f.a.len() * 2), self.alloc(f.bt.len() * 2)) else { return };
                // SAFETY: f16 as bytes.
                let (ab, bb) = unsafe {
                    (
                        std::slice::from_raw_parts(f.a.as_ptr() as *const u8, f.a.len() * 2),
                        std::slice::from_raw_parts(f.bt.as_ptr() as *const u8, f.bt.len() * 2),
                    )
                };
                self.upload(a.ptr, ab);
                self.upload(b.ptr, bb);
                self.lora.insert(key, (a, b));
            }
            let (ap, bp) = {
                let (a, b) = &self.lora[&key];
                (a.ptr, b.ptr)
            };
            let y = self.buf(dsts[k]);
            let (name_a, name_b, per_block) = if self.exact { ("ref_lr_a", "ref_lr_b", 256) } else { ("low_rank_a", "low_rank_b", 8) };
            self.push(
                name_a,
                [Self::blocks(f.rank * n, per_block), 1, 1],
                256,
                Args::new().ptr(ap).ptr(x).ptr(tmp).i32(f.rank as i32).i32(f.d_in as i32).i32(n as i32),
            );
            self.push(
                name_b,
                [Self::blocks(f.d_out * n, 256), 1, 1],
                256,
                Args::new().ptr(bp).ptr(tmp).ptr(y).i32(f.rank as i32).i32(f.d_out as i32).f32(scale).i32(n as i32),
            );
        }
    }

    fn rope(&mut self, table: &RopeTable, buf: Buf, head_dim: usize, pos0: usize, n: usize) {
        self.begin_pass(pos0, n);
        let (c, s) = table.cos_sin();
        let (cp, sp) = (self.vector(c), self.vector(s));
        let style = i32::from(table.style == RopeStyle::Neox);
        if self.exact {
            let width = self.widths.of(buf);
            let pairs = n * (width / head_dim.max(1)) * (table.rot_dim / 2);
            let args = Args::new()
                .ptr(self.buf(buf))
                .ptr(cp)
                .ptr(sp)
                .i32(width as i32)
                .i32(head_dim as i32)
                .i32(table.rot_dim as i32)
                .i32(style)
                .i32(pos0 as i32)
                .i32(n as i32);
            self.push("ref_rope", [Self::blocks(pairs, 128), 1, 1], 128, args);
            return;
        }
        let step = Self::ptr_of(&self.step_dev);
        let args =
            Args::new().ptr(self.buf(buf)).ptr(cp).ptr(sp).i32(self.widths.of(buf) as i32).i32(head_dim as i32).i32(table.rot_dim as i32).i32(style).ptr(step);
        self.push("rope", [n as u32, 1, 1], 128, args);
    }

    fn store_kv(&mut self, cache: &mut LayerCache, pos0: usize, n: usize) {
        self.begin_pass(pos0, n);
        let Some(d) = self.device_rows(cache) else { return };
        let step = Self::ptr_of(&self.step_dev);
        let args = Args::new()
            .ptr(self.buf(Buf::K))
            .ptr(self.buf(Buf::V))
            .ptr(d.k)
            .ptr(d.v)
            .i32(self.widths.kv_dim as i32)
            .i32(cache.capacity as i32)
            .i32(i32::from(d.elem == 2))
            .ptr(step);
        self.push("store_kv", [n as u32, 1, 1], 256, args);
    }

    fn attention(&mut self, cache: &LayerCache, shape: AttnShape, mask: AttentionMask, window: Option<usize>, pos0: usize, n: usize) {
        self.attention_launch(cache, shape, mask, window, pos0, n, [0; 8]);
    }

    fn segment_attention(
        &mut self,
        norms: QkNorms,
        rope: &RopeTable,
        cache: &mut LayerCache,
        shape: AttnShape,
        span: Span,
        row0: usize,
        pos0: usize,
        n: usize,
    ) {
        if self.segs.is_some() {
            return self.segment_attention_batched(norms, rope, cache, shape, span);
        }
        if row0 != 0 {
            self.fail(Error::Internal("segment_attention: a later sequence of a pass not announced by begin_segments".into()));
            return;
        }
        let (d, half) = (shape.head_dim / 32, rope.rot_dim / 2);
        // The kernel holds D = head_dim / 32 elements per lane: a rotation pair must sit in one
        // lane (adjacent style) or the same slot of another (halves style).
        let pairs_fit = if rope.style == RopeStyle::Neox { d > 0 && half.is_multiple_of(d) } else { d.is_multiple_of(2) };
        let fits = rope.rot_dim <= shape.head_dim && pairs_fit;
        if n != 1 || !self.fuse_qk || !fits || self.widths.q_dim != shape.n_head * shape.head_dim {
            self.qk_rope_store(norms.q, norms.k, norms.eps, rope, shape.head_dim, cache, pos0, n);
            self.attention(cache, shape, span.mask, span.window, pos0, n);
            return;
        }
        // One token: its QK-norm, RoPE and KV store run inside the attention kernel.
        let qn = norms.q.map_or(0, |w| self.vector(w));
        let kn = norms.k.map_or(0, |w| self.vector(w));
        let (c, s) = rope.cos_sin();
        let (cp, sp) = (self.vector(c), self.vector(s));
        let style = u64::from(rope.style == RopeStyle::Neox);
        let fuse = [self.buf(Buf::K), self.buf(Buf::V), qn, kn, cp, sp, norms.eps.to_bits() as u64 | ((rope.rot_dim as u64) << 32), style | (1u64 << 32)];
        self.attention_launch(cache, shape, span.mask, span.window, pos0, n, fuse);
    }

    fn add(&mut self, dst: Buf, src: Buf, n: usize) {
        let count = n * self.widths.of(dst);
        self.push("add_inplace", [Self::blocks(count, 256), 1, 1], 256, Args::new().ptr(self.buf(dst)).ptr(self.buf(src)).i32(count as i32));
    }

    fn gated_activation(&mut self, act: Activation, n: usize) {
        let count = n * self.widths.ff_dim;
        let a = i32::from(act == Activation::Silu);
        self.push(
            if self.exact { "ref_gated" } else { "gated" },
            [Self::blocks(count, 256), 1, 1],
            256,
            Args::new().ptr(self.buf(Buf::Gate)).ptr(self.buf(Buf::Up)).i32(count as i32).i32(a),
        );
    }

    fn residual_norm(&mut self, post: Option<&[f32]>, next: Option<&[f32]>, eps: f32, n: usize) {
        if self.exact {
            // The CPU's order: the post-norm in place, the add, the next block's norm.
            return super::residual_steps(self, post, next, eps, n);
        }
        self.settle();
        let pp = post.map_or(0, |w| self.vector(w));
        let np = next.map_or(0, |w| self.vector(w));
        let r = PendingRes { post: pp, next: np, eps };
        if n == 1 && np != 0 && self.fuse_res && self.ok() {
            self.pending_res = Some(r);
        } else {
            self.residual_kernel(r, n);
        }
    }

    fn matmul_gated(&mut self, gate: &QWeight, up: &QWeight, act: Activation, n: usize) -> bool {
        if self.exact
            || n > self.mmv_max
            || (n == 1 && self.one_token_mmvq(gate.ty, gate.cols))
            || gate.ty != up.ty
            || gate.rows != up.rows
            || gate.cols != up.cols
        {
            return false;
        }
        let (Some((gp, rb)), Some((upp, _))) = (self.weight(gate), self.weight(up)) else { return true };
        let suffix = type_suffix(gate.ty).unwrap_or("f32");
        let a = i32::from(act == Activation::Silu);
        let args = Args::new().ptr(gp).ptr(upp).i64(rb as i64).i32(gate.rows as i32).ptr(self.buf(Buf::Xn)).i32(gate.cols as i32).ptr(self.buf(Buf::Gate));
        let grid = [Self::blocks(gate.rows, 8), 1, 1];
        if n == 1 && gate.cols <= MMV1_MAX_COLS {
            let res = self.take_res(Buf::Xn, gate.cols);
            self.push(&format!("mmvg1s_{suffix}"), grid, 256, args.i32(a).words(&res));
        } else {
            let nt = if n == 1 { 1 } else { 8 };
            self.push(&format!("mmvg{nt}_{suffix}"), grid, 256, args.i32(n as i32).i32(a));
        }
        true
    }

    fn qk_rope_store(
        &mut self,
        q_norm: Option<&[f32]>,
        k_norm: Option<&[f32]>,
        eps: f32,
        rope: &RopeTable,
        head_dim: usize,
        cache: &mut LayerCache,
        pos0: usize,
        n: usize,
    ) {
        self.begin_pass(pos0, n);
        if self.exact {
            // The CPU's order: the per-head norms, RoPE of Q then K, the store.
            return super::qk_rope_store_steps(self, QkNorms { q: q_norm, k: k_norm, eps }, rope, head_dim, cache, pos0, n);
        }
        let Some(kv) = self.kv_ref(cache) else { return };
        self.qk_kernel(QkNorms { q: q_norm, k: k_norm, eps }, rope, head_dim, kv, n, [0, 0]);
    }

    fn lm_head(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, rows: &[usize]) -> &mut [f32] {
        self.head(output, norm, eps, softcap, rows);
        self.logits()
    }

    fn lm_head_deferred(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, rows: &[usize]) {
        self.head(output, norm, eps, softcap, rows);
    }

    fn final_hidden(&mut self, norm: &[f32], eps: f32, n: usize) -> &[f32] {
        self.rms_norm(Buf::X, Buf::Xn, norm, eps, n);
        self.flush();
        let d = self.widths.d_model;
        self.hidden_host.resize(n * d, 0.0);
        let src = self.buf(Buf::Xn);
        self.sync();
        if self.ok() {
            // SAFETY: a synchronous copy into our vector of n·d floats.
            let r = unsafe { (self.api.memcpy_dtoh_async)(self.hidden_host.as_mut_ptr() as *mut c_void, src, n * d * 4, self.stream) };
            if let Err(e) = check(self.api, "cuMemcpyDtoH", r) {
                self.fail(gpu_error(&e));
            }
            self.sync();
        }
        if !self.ok() {
            return &[];
        }
        &self.hidden_host
    }

    fn logits(&mut self) -> &mut [f32] {
        let len = self.head_rows * self.widths.vocab_size;
        if !self.logits_ready {
            self.flush();
            let dst = self.logits_host.as_ref().map_or(std::ptr::null_mut(), |h| h.ptr);
            if !dst.is_null() {
                self.copy_back(dst, Self::ptr_of(&self.logits_dev), len * 4);
            }
            self.sync();
            self.logits_ready = true;
        }
        match (&mut self.logits_host, self.error.is_none()) {
            (Some(h), true) => h.as_f32(len),
            _ => {
                self.hidden_host.clear();
                self.hidden_host.resize(len, 0.0);
                &mut self.hidden_host
            }
        }
    }

    fn device_picks(&mut self) -> Option<&mut dyn DevicePicks> {
        Some(self)
    }

    fn pick_queue(&mut self) -> Option<&mut dyn PickQueue> {
        Some(self)
    }
}

/// An id for factors that carry none (0): a hash of their values.
fn content_id(a: &[half::f16], bt: &[half::f16]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for v in a.iter().chain(bt) {
        v.to_bits().hash(&mut h);
    }
    h.finish() | (1 << 63)
}

#[cfg(test)]
mod tests {
    use super::{check_model, AttnShape, KvType};

    #[test]
    fn the_backend_says_which_models_it_runs() {
        let shape = |n_head, n_kv_head, head_dim, softcap| AttnShape { n_head, n_kv_head, head_dim, scale: 1.0, softcap };
        let check = |s, d, kv| check_model(std::iter::empty(), s, d, kv);
        // Qwen2.5-0.5B, Gemma 3 270M, a Llama 3 8B shape.
        assert!(check(shape(14, 2, 64, None), 896, KvType::F16).is_ok());
        assert!(check(shape(4, 1, 256, None), 640, KvType::F16).is_ok());
        assert!(check(shape(32, 8, 128, None), 4096, KvType::F32).is_ok());
        let why = |r: std::result::Result<(), String>| r.expect_err("refused");
        assert!(why(check(shape(14, 2, 64, None), 896, KvType::Q8_0)).contains("q8_0"));
        assert!(why(check(shape(8, 4, 256, Some(50.0)), 2304, KvType::F16)).contains("soft-capping"));
        assert!(why(check(shape(36, 4, 128, None), 4096, KvType::F16)).contains("9 heads per KV head"));
        assert!(why(check(shape(16, 16, 48, None), 768, KvType::F16)).contains("head_dim 48"));
        assert!(why(check(shape(40, 8, 128, None), 5120, KvType::F16)).contains("5120"));
    }
}
