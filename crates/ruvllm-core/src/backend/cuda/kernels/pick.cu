// Greedy picks and the per-row best logits for sampling on the device. Part of kernels.cu (included there, one translation unit).

// ---------------------------------------------------------------------------------------------
// Greedy pick on the device: the largest non-NaN logit of row 0, lowest index on ties (the
// CPU sampler's argmax). Stage 1: one candidate per block; stage 2: one block over those.

__device__ __forceinline__ void better(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}

// The block's best (value, index) into thread 0's bv, bi.
__device__ __forceinline__ void block_best(float& bv, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffff, bv, o);
        const int oi = __shfl_xor_sync(0xffffffff, bi, o);
        better(bv, bi, ov, oi);
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) better(bv, bi, sv[w], si[w]);
}

// Grid (parts, rows): row blockIdx.y of `v` (rows of `count`) into its `parts` candidates.
extern "C" __global__ void argmax1(const float* v, int count, float* pv, int* pi) {
    PDL_ENTRY();
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    v += (size_t)blockIdx.y * count;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) better(bv, bi, v[i], i);
    block_best(bv, bi);
    if (threadIdx.x == 0) {
        pv[blockIdx.y * gridDim.x + blockIdx.x] = bv;
        pi[blockIdx.y * gridDim.x + blockIdx.x] = bi;
    }
}

// Grid (rows): row blockIdx.x's pick into out[blockIdx.x] (one row: also the kept pick).
extern "C" __global__ void argmax2(const float* pv, const int* pi, int parts, int* out, const int* step) {
    PDL_ENTRY();
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    pv += (size_t)blockIdx.x * parts;
    pi += (size_t)blockIdx.x * parts;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) better(bv, bi, pv[i], pi[i]);
    block_best(bv, bi);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
        if (gridDim.x == 1 && (step[3] & STEP_KEEP_PICK)) out[2] = out[0];
    }
}

// ---------------------------------------------------------------------------------------------
// The best TOPC logits of each row, sorted (higher first, lower id on ties; NaN and -inf last as
// -inf, +inf as the largest float, as the sampler treats them): a sampler that keeps the top k
// (k < TOPC) picks from these exactly as from the whole row (`Sampler::sample_top`). Stage 1
// keeps each 2048-logit slice's best TOPC; stage 2 merges up to 32 such lists per block, again
// until one list per row is left. Every list of a row lives at [(row * lists + list) * TOPC].
// Padding takes -inf with ids from TOP_PAD up (unique, above every vocabulary id).

#define TOPC 64
#define TOP_SLICE 2048
#define TOP_PAD 0x40000000

__device__ __forceinline__ bool top_before(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// Order-preserving unsigned key of a float (larger float, larger key).
__device__ __forceinline__ unsigned top_key(float v) {
    const unsigned b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Sum of every thread's `v` over the block (256 threads), to all of them.
__device__ __forceinline__ int top_sum(int v, int* red) {
    v = __reduce_add_sync(0xffffffff, v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    int t = 0;
#pragma unroll
    for (int w = 0; w < 8; w++) t += red[w];
    return t;
}

// The best TOPC of the block's TOP_SLICE (value, id) pairs, 8 per thread (ids unique), sorted to
// ov/oi: the TOPC-th largest value found bit by bit (radix select), then among the pairs equal
// to it the lowest ids, the chosen ones gathered and sorted in shared memory.
__device__ __forceinline__ void top_keep(const float* v, const int* id, float* ov, int* oi) {
    __shared__ int red[8];
    __shared__ float sv[TOPC];
    __shared__ int si[TOPC];
    unsigned key[8];
#pragma unroll
    for (int i = 0; i < 8; i++) key[i] = top_key(v[i]);
    unsigned T = 0;
    for (int bit = 31; bit >= 0; bit--) {
        const unsigned c = T | (1u << bit);
        int cnt = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) cnt += key[i] >= c;
        if (top_sum(cnt, red) >= TOPC) T = c;
    }
    int gt = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) gt += key[i] > T;
    const int need = TOPC - top_sum(gt, red);
    // U: the need-th smallest id among the pairs equal to T.
    unsigned U = 0;
    for (int bit = 30; bit >= 0; bit--) {
        const unsigned c = U | (1u << bit);
        int cnt = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) cnt += key[i] == T && (unsigned)id[i] < c;
        if (top_sum(cnt, red) < need) U = c;
    }
    bool keep[8];
    int mine = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        keep[i] = key[i] > T || (key[i] == T && (unsigned)id[i] <= U);
        mine += keep[i];
    }
    // Exclusive scan of the per-thread counts (inclusive in a warp, then the warps' totals).
    int inc = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffff, inc, o);
        if ((threadIdx.x & 31) >= o) inc += x;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 31) red[threadIdx.x >> 5] = inc;
    __syncthreads();
    int base = 0;
    for (int w = 0; w < (int)(threadIdx.x >> 5); w++) base += red[w];
    int at = base + inc - mine;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (keep[i] && at < TOPC) { sv[at] = v[i]; si[at] = id[i]; at++; }
    __syncthreads();
    // Bitonic sort of the TOPC kept pairs, best first.
    for (int k = 2; k <= TOPC; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            const int i = threadIdx.x, x = i ^ j;
            if (i < TOPC && x > i) {
                const bool first = (i & k) == 0;
                const bool swap = first ? top_before(sv[x], si[x], sv[i], si[i]) : top_before(sv[i], si[i], sv[x], si[x]);
                if (swap) {
                    const float tv = sv[i]; sv[i] = sv[x]; sv[x] = tv;
                    const int ti = si[i]; si[i] = si[x]; si[x] = ti;
                }
            }
            __syncthreads();
        }
    }
    if (threadIdx.x < TOPC) { ov[threadIdx.x] = sv[threadIdx.x]; oi[threadIdx.x] = si[threadIdx.x]; }
}

// Grid (lists, rows), 256 threads: slice blockIdx.x of row blockIdx.y of `logits` (rows of `count`).
extern "C" __global__ void __launch_bounds__(256) top1(const float* logits, int count, float* ov, int* oi) {
    PDL_ENTRY();
    const float* row = logits + (size_t)blockIdx.y * count;
    float v[8];
    int id[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int j = blockIdx.x * TOP_SLICE + threadIdx.x * 8 + i;
        const float x = j < count ? row[j] : -INFINITY;
        v[i] = isnan(x) ? -INFINITY : fminf(x, 3.402823466e38f);
        id[i] = j < count ? j : TOP_PAD + j;
    }
    const size_t out = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * TOPC;
    top_keep(v, id, ov + out, oi + out);
}

// Grid (groups, rows), 256 threads: lists 32*blockIdx.x.. (of `lists` per row) into one.
extern "C" __global__ void __launch_bounds__(256) top2(const float* iv, const int* ii, int lists, float* ov, int* oi) {
    PDL_ENTRY();
    const int first = blockIdx.x * (TOP_SLICE / TOPC), have = min(TOP_SLICE / TOPC, lists - first) * TOPC;
    const size_t in = ((size_t)blockIdx.y * lists + first) * TOPC;
    float v[8];
    int id[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int j = threadIdx.x * 8 + i;
        v[i] = j < have ? iv[in + j] : -INFINITY;
        id[i] = j < have ? ii[in + j] : TOP_PAD + 0x20000000 + j;
    }
    const size_t out = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * TOPC;
    top_keep(v, id, ov + out, oi + out);
}

// ---------------------------------------------------------------------------------------------
// What a diffusion step's confidences need besides the best logits: each row's log-sum-exp,
// with one token (the mask) taken out of every row first.

// Rows 0..rows-1 of `logits` (rows of `count`): logit `id` becomes -inf.
extern "C" __global__ void drop_logit(float* logits, int count, int rows, int id) {
    PDL_ENTRY();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) logits[(size_t)r * count + id] = -INFINITY;
}

// (max, sum of exp(x - max)) pairs merged; a max of -inf holds nothing.
__device__ __forceinline__ void lse_merge(float& m, float& s, float om, float os) {
    if (om == -INFINITY) return;
    if (m == -INFINITY) { m = om; s = os; return; }
    if (om > m) { s = s * expf(m - om) + os; m = om; } else s += os * expf(om - m);
}

// Grid (parts, rows), 256 threads: part blockIdx.x of row blockIdx.y (rows of `count`): its
// largest logit and the sum of exp(logit - that) into out[(row * parts + part) * 2 ..], NaN and
// -inf left out, +inf as the largest float (the sampler's view); the host merges the parts.
extern "C" __global__ void __launch_bounds__(256) row_lse(const float* logits, int count, float* out) {
    PDL_ENTRY();
    const float* row = logits + (size_t)blockIdx.y * count;
    const int per = (count + gridDim.x - 1) / gridDim.x;
    const int lo = blockIdx.x * per, hi = min(count, lo + per);
    float m = -INFINITY, s = 0.f;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        const float x = row[j];
        if (!(x > -INFINITY)) continue;
        lse_merge(m, s, fminf(x, 3.402823466e38f), 1.f);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffff, m, o), os = __shfl_xor_sync(0xffffffff, s, o);
        lse_merge(m, s, om, os);
    }
    __shared__ float sm[8], ss[8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) lse_merge(m, s, sm[w], ss[w]);
        const size_t o = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * 2;
        out[o] = m;
        out[o + 1] = s;
    }
}
