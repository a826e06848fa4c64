// ruvllm's CUDA kernels: everything a forward pass of our transformer needs, on the device.
// Compiled at build time by nvcc (crates/ruvllm-core/build.rs) into a fatbin that the addon
// embeds and loads through the driver API; no CUDA runtime library is linked.
//
// Weights stay in their GGUF block formats (the same bytes as the file) and are dequantized in
// registers: `dq8<T>(row, j, y)` writes elements j..j+7 (j a multiple of 8) of one row.
// Per-step values that change between decode steps (the position, the token ids, the LM-head
// rows) are read from a device "step" block, so a decode step's launches are identical from one
// token to the next and can be replayed as a CUDA graph.
//
// Step block layout (int32): [0] pos0, [1] n, [2] rows, [3] flags, [4 .. 4+max_batch) tokens,
// [4+max_batch .. 4+2*max_batch) LM-head rows. Flags: STEP_KEEP_PICK, the LM head's greedy pick
// also goes to out[2] (a queued pick, kept for the pass that takes it); STEP_TOKEN_PICK, the
// pass's token 0 is that kept pick (the embedding reads it there).
//
// A pass of several sequences (batched decode, prefill chunks beside it) adds, after the LM-head
// rows, each row's (position, sequence) pair ([4+2*max_batch ..), `rows` in the kernels), then
// per layer one `SegKv` per sequence: its cache's K and V rows (`kvt`). A kernel given `rows`
// takes each row's position and cache from there instead of pos0 + t and its own arguments.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <mma.h>

#define STEP_KEEP_PICK 1
#define STEP_TOKEN_PICK 2

typedef uint8_t u8;

// One sequence's KV cache in one layer (a multi-sequence pass; see the step block above).
struct SegKv {
    void* k;
    void* v;
    int capacity;
    int f16;
};

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30
// Q8_0 as uploaded: per 256 columns, the eight f16 scales (16 bytes) then the 256 8-bit values,
// so a warp reads one such chunk with aligned 8-byte loads (the last chunk of a row may be short).
#define T_Q8_0R 100

// Programmatic dependent launch (sm_90): a kernel launched with the PDL attribute may start
// while the kernel before it still runs. Every kernel here may first read what no earlier kernel
// writes (weights, into L2), then calls `pdl_wait` before touching anything an earlier kernel
// writes or reads: it returns once the previous grid has completed and its writes are visible.
// Only then does it let its own dependents start (`pdl_launch`), so at most one kernel waits
// ahead of the running one (letting them start first chained many waiting kernels onto the
// multiprocessors). Every kernel waits in every block, so completion stays ordered along the
// whole stream. Without PDL both are no-ops.
__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#define PDL_ENTRY() \
    do {             \
        pdl_wait();  \
        pdl_launch(); \
    } while (0)
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// Pulls `bytes` from `p` into L2, one 128-byte line per lane of the calling warp at a time.
__device__ __forceinline__ void prefetch_row(const u8* p, long long bytes, int lane) {
    for (long long o = (long long)lane * 128; o < bytes; o += 32 * 128) prefetch_l2(p + o);
}

__device__ __forceinline__ float ldh(const u8* p) { return __half2float(*(const __half*)p); }
__device__ __forceinline__ uint32_t ld32u(const u8* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// Scale and min of sub-block `j` (0..7) of a Q4_K / Q5_K super-block (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

template <int T> __device__ __forceinline__ void dq8(const u8* row, int j, float* y);

template <> __device__ __forceinline__ void dq8<T_F32>(const u8* row, int j, float* y) {
    const float4* p = (const float4*)(row + (size_t)j * 4);
    float4 a = p[0], b = p[1];
    y[0] = a.x; y[1] = a.y; y[2] = a.z; y[3] = a.w; y[4] = b.x; y[5] = b.y; y[6] = b.z; y[7] = b.w;
}
template <> __device__ __forceinline__ void dq8<T_F16>(const u8* row, int j, float* y) {
    uint4 v = *(const uint4*)(row + (size_t)j * 2);
    const __half* h = (const __half*)&v;
#pragma unroll
    for (int i = 0; i < 8; i++) y[i] = __half2float(h[i]);
}
template <> __device__ __forceinline__ void dq8<T_BF16>(const u8* row, int j, float* y) {
    uint4 v = *(const uint4*)(row + (size_t)j * 2);
    const __nv_bfloat16* h = (const __nv_bfloat16*)&v;
#pragma unroll
    for (int i = 0; i < 8; i++) y[i] = __bfloat162float(h[i]);
}
template <> __device__ __forceinline__ void dq8<T_Q8_0>(const u8* row, int j, float* y) {
    const u8* b = row + (size_t)(j >> 5) * 34;
    float d = ldh(b);
    const uint16_t* q = (const uint16_t*)(b + 2 + (j & 31));
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint16_t v = q[i];
        y[2 * i] = d * (float)(int8_t)(v & 0xFF);
        y[2 * i + 1] = d * (float)(int8_t)(v >> 8);
    }
}
template <> __device__ __forceinline__ void dq8<T_Q8_0R>(const u8* row, int j, float* y) {
    const u8* c = row + (size_t)(j >> 8) * 272;
    const int e = j & 255;
    const float d = __half2float(((const __half*)c)[e >> 5]);
    const uint2 v = *(const uint2*)(c + 16 + e);
#pragma unroll
    for (int i = 0; i < 4; i++) y[i] = d * (float)(int8_t)((v.x >> (8 * i)) & 0xFF);
#pragma unroll
    for (int i = 0; i < 4; i++) y[4 + i] = d * (float)(int8_t)((v.y >> (8 * i)) & 0xFF);
}
template <> __device__ __forceinline__ void dq8<T_Q4_0>(const u8* row, int j, float* y) {
    const u8* b = row + (size_t)(j >> 5) * 18;
    float d = ldh(b);
    int o = j & 31;
    const u8* q = b + 2 + (o & 15);
    int sh = o < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) y[i] = d * (float)(((q[i] >> sh) & 0xF) - 8);
}
template <> __device__ __forceinline__ void dq8<T_Q4_1>(const u8* row, int j, float* y) {
    const u8* b = row + (size_t)(j >> 5) * 20;
    float d = ldh(b), m = ldh(b + 2);
    int o = j & 31;
    const u8* q = b + 4 + (o & 15);
    int sh = o < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) y[i] = d * (float)((q[i] >> sh) & 0xF) + m;
}
template <> __device__ __forceinline__ void dq8<T_Q5_0>(const u8* row, int j, float* y) {
    const u8* b = row + (size_t)(j >> 5) * 22;
    float d = ldh(b);
    uint32_t qh = ld32u(b + 2);
    int o = j & 31;
    const u8* q = b + 6 + (o & 15);
    int sh = o < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int v = ((q[i] >> sh) & 0xF) | (((qh >> (o + i)) & 1) << 4);
        y[i] = d * (float)(v - 16);
    }
}
template <> __device__ __forceinline__ void dq8<T_Q5_1>(const u8* row, int j, float* y) {
    const u8* b = row + (size_t)(j >> 5) * 24;
    float d = ldh(b), m = ldh(b + 2);
    uint32_t qh = ld32u(b + 4);
    int o = j & 31;
    const u8* q = b + 8 + (o & 15);
    int sh = o < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int v = ((q[i] >> sh) & 0xF) | (((qh >> (o + i)) & 1) << 4);
        y[i] = d * (float)v + m;
    }
}
template <> __device__ __forceinline__ void dq8<T_Q4_K>(const u8* row, int j, float* y) {
    const u8* b = row + (size_t)(j >> 8) * 144;
    float d = ldh(b), dmin = ldh(b + 2);
    int e = j & 255, g = e >> 6, h = e & 63;
    float sc, m;
    scale_min_k4(2 * g + (h >= 32), b + 4, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    const u8* q = b + 16 + 32 * g + (h & 31);
    int sh = h < 32 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) y[i] = d1 * (float)((q[i] >> sh) & 0xF) - m1;
}
template <> __device__ __forceinline__ void dq8<T_Q5_K>(const u8* row, int j, float* y) {
    const u8* b = row + (size_t)(j >> 8) * 176;
    float d = ldh(b), dmin = ldh(b + 2);
    int e = j & 255, g = e >> 6, h = e & 63, l = h & 31;
    int is = 2 * g + (h >= 32);
    float sc, m;
    scale_min_k4(is, b + 4, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    const u8* qh = b + 16 + l;
    const u8* q = b + 48 + 32 * g + l;
    int sh = h < 32 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int v = ((q[i] >> sh) & 0xF) + (((qh[i] >> is) & 1) << 4);
        y[i] = d1 * (float)v - m1;
    }
}
template <> __device__ __forceinline__ void dq8<T_Q6_K>(const u8* row, int j, float* y) {
    const u8* b = row + (size_t)(j >> 8) * 210;
    float d = ldh(b + 208);
    int e = j & 255, n = e >> 7, r = e & 127, qq = r >> 5, l = r & 31;
    const u8* ql = b + 64 * n + l + (qq & 1) * 32;
    const u8* qh = b + 128 + 32 * n + l;
    float s = d * (float)((const int8_t*)(b + 192))[8 * n + l / 16 + 2 * qq];
    int sh = qq >= 2 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int v = ((ql[i] >> sh) & 0xF) | (((qh[i] >> (2 * qq)) & 3) << 4);
        y[i] = s * (float)(v - 32);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.f;
    return warp_sum(t);
}

// The residual step of one token, the whole block taking part: xo = x + (post ? RMSNorm(p, post)
// : p) and, when `next` is given, RMSNorm(xo, next) into xn and xs (each when non-null). xo may
// be x (each thread reads its elements before writing them), or null (not stored).
#define RN_MAX 16
__device__ __forceinline__ void residual_body(const float* x, float* xo, const float* p, const float* post, const float* next, int d, float eps, float* xn, float* xs) {
    __shared__ float red[32];
    float v[RN_MAX], pv[RN_MAX];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < RN_MAX; k++) {
        const int j = threadIdx.x + k * blockDim.x;
        pv[k] = j < d ? p[j] : 0.f;
        v[k] = j < d ? x[j] : 0.f;
        ss += pv[k] * pv[k];
    }
    float s = 1.f;
    if (post) {
        ss = block_sum(ss, red);
        s = rsqrtf(ss / (float)d + eps);
    }
    float ss2 = 0.f;
#pragma unroll
    for (int k = 0; k < RN_MAX; k++) {
        const int j = threadIdx.x + k * blockDim.x;
        if (j < d) {
            v[k] += post ? pv[k] * s * post[j] : pv[k];
            if (xo) xo[j] = v[k];
            ss2 += v[k] * v[k];
        }
    }
    if (!next) return;
    ss2 = block_sum(ss2, red);
    const float s2 = rsqrtf(ss2 / (float)d + eps);
#pragma unroll
    for (int k = 0; k < RN_MAX; k++) {
        const int j = threadIdx.x + k * blockDim.x;
        if (j < d) {
            const float y = v[k] * s2 * next[j];
            if (xn) xn[j] = y;
            if (xs) xs[j] = y;
        }
    }
}

// A residual step folded into the one-token product that reads its normed output (see
// `mmv1s_body`): the residual moves from `x` to `xo` (another buffer: the blocks of the product
// run in any order, and each reads x), and block 0 stores the new residual and the normed vector
// `xn` for whatever else reads them.
struct Res {
    const float* x;
    const float* p;
    const float* post;
    const float* next;
    float* xo;
    float* xn;
    float eps;
    int on;
};

// ---------------------------------------------------------------------------------------------
// Matrix-vector products for up to NT tokens: one warp per output row. Up to three weights of
// the same type and input width run in one launch (Q, K, V; gate, up), rows numbered across them.
// Y_k[t * rows_k + r] = W_k[r, :] · X[t, :].

struct Mmv3 {
    const u8* w[3];
    long long rb[3];
    int rows[3];
    float* y[3];
};

// Activations are rounded as the CPU path quantizes them (ggml's scheme): to Q8_0 (32-blocks,
// scale amax/127 in f16) for weights in 32-blocks, to Q8_K (256-blocks, scale -max/127) for the
// K-quants, not at all for float weights; the products then agree with the CPU's to float
// rounding. ACT: 0 none, 1 Q8_0, 2 Q8_K.
template <int T> struct Act { static const int kind = 0; };
template <> struct Act<T_Q4_0> { static const int kind = 1; };
template <> struct Act<T_Q4_1> { static const int kind = 1; };
template <> struct Act<T_Q5_0> { static const int kind = 1; };
template <> struct Act<T_Q5_1> { static const int kind = 1; };
template <> struct Act<T_Q8_0> { static const int kind = 1; };
template <> struct Act<T_Q8_0R> { static const int kind = 1; };
template <> struct Act<T_Q4_K> { static const int kind = 2; };
template <> struct Act<T_Q5_K> { static const int kind = 2; };
template <> struct Act<T_Q6_K> { static const int kind = 2; };

// The Q8_0 scale of the 32-block that lanes 4q..4q+3 hold (8 elements x each): d as stored
// (f16), and the factor id that maps x to its quants (__float2int_rn(x · id)).
__device__ __forceinline__ void q8_0_scale(const float* x, float& d, float& id) {
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(x[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 2));
    d = __half2float(__float2half_rn(amax / 127.f));
    id = amax != 0.f ? 127.f / amax : 0.f;
}

// The Q8_0 quants of x[0..8) (id from `q8_0_scale`), four to a word.
__device__ __forceinline__ uint2 q8_0_pack(const float* x, float id) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) lo |= ((uint32_t)(__float2int_rn(x[i] * id) & 0xFF)) << (8 * i);
#pragma unroll
    for (int i = 0; i < 4; i++) hi |= ((uint32_t)(__float2int_rn(x[4 + i] * id) & 0xFF)) << (8 * i);
    return make_uint2(lo, hi);
}

// x: elements lane*8.. of a warp-wide 256-element chunk; every lane of the warp calls it.
template <int KIND>
__device__ __forceinline__ void act_round(float* x, int lane) {
    if (KIND == 1) {
        float d, id;
        q8_0_scale(x, d, id);
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = (float)__float2int_rn(x[i] * id) * d;
    } else if (KIND == 2) {
        float amax = 0.f, mx = 0.f;
        int idx = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); mx = x[i]; idx = lane * 8 + i; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float oa = __shfl_xor_sync(0xffffffff, amax, o), om = __shfl_xor_sync(0xffffffff, mx, o);
            const int oi = __shfl_xor_sync(0xffffffff, idx, o);
            if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
        }
        if (amax == 0.f) return;
        const float iscale = -127.f / mx, d = 1.f / iscale;
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = (float)min(127, __float2int_rn(iscale * x[i])) * d;
    }
}

// x = elements j..j+7 of one activation row (zeros when !in), rounded as the CPU path rounds
// activations for weight type T; every lane of the warp calls it.
template <int T>
__device__ __forceinline__ void load_x8(const float* __restrict__ row, int j, bool in, int lane, float* x) {
    if (in) {
        const float4* xp = (const float4*)(row + j);
        const float4 p = xp[0], q = xp[1];
        x[0] = p.x; x[1] = p.y; x[2] = p.z; x[3] = p.w; x[4] = q.x; x[5] = q.y; x[6] = q.z; x[7] = q.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = 0.f;
    }
    act_round<Act<T>::kind>(x, lane);
}

// Row `r` (numbered across the three weights) of `a`: its weight, row bytes, output and the
// weight's row count, with `r` made relative to that weight; false past the last row.
__device__ __forceinline__ bool mmv_pick(const Mmv3& a, int& r, const u8*& w0, long long& rb, float*& y, int& rows) {
    if (r < a.rows[0]) { w0 = a.w[0]; rb = a.rb[0]; y = a.y[0]; rows = a.rows[0]; }
    else if (r - a.rows[0] < a.rows[1]) { r -= a.rows[0]; w0 = a.w[1]; rb = a.rb[1]; y = a.y[1]; rows = a.rows[1]; }
    else if (r - a.rows[0] - a.rows[1] < a.rows[2]) { r -= a.rows[0] + a.rows[1]; w0 = a.w[2]; rb = a.rb[2]; y = a.y[2]; rows = a.rows[2]; }
    else return false;
    return true;
}

template <int T, int NT>
__device__ __forceinline__ void mmv_body(const Mmv3& a, const float* __restrict__ X, int cols, int n) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    const u8* w0;
    long long rb;
    float* y;
    int rows;
    if (!mmv_pick(a, r, w0, rb, y, rows)) {
        PDL_ENTRY();
        return;
    }
    const u8* row = w0 + (size_t)r * rb;
    prefetch_row(row, rb, lane);
    PDL_ENTRY();
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    for (int j0 = 0; j0 < cols; j0 += 256) {
        const int j = j0 + lane * 8;
        const bool in = j < cols;
        float w[8];
        if (in) dq8<T>(row, j, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < n) {
                float x[8];
                load_x8<T>(X + (size_t)t * cols, j, in, lane, x);
                if (in) {
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[t] += w[i] * x[i];
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t < n) y[(size_t)t * rows + r] = s;
    }
}

// Gate and up projections of one FFN row in one warp, for up to NT tokens:
// G[t * rows + r] = act(Wg[r] · X[t]) · (Wu[r] · X[t]); act 0: GELU (tanh), 1: SiLU.
__device__ __forceinline__ float gate_act(float g, int act) {
    if (act == 0) {
        const float c = 0.7978845608028654f;
        return 0.5f * g * (1.f + tanhf(c * (g + 0.044715f * g * g * g)));
    }
    return g / (1.f + __expf(-g));
}

template <int T, int NT>
__device__ __forceinline__ void mmvg_body(const u8* __restrict__ Wg, const u8* __restrict__ Wu, long long rb, int rows, const float* __restrict__ X, int cols, float* __restrict__ G, int n, int act) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= rows) {
        PDL_ENTRY();
        return;
    }
    const u8* rg = Wg + (size_t)r * rb;
    const u8* ru = Wu + (size_t)r * rb;
    prefetch_row(rg, rb, lane);
    prefetch_row(ru, rb, lane);
    PDL_ENTRY();
    float ag[NT], au[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) { ag[t] = 0.f; au[t] = 0.f; }
    for (int j0 = 0; j0 < cols; j0 += 256) {
        const int j = j0 + lane * 8;
        const bool in = j < cols;
        float wg[8], wu[8];
        if (in) { dq8<T>(rg, j, wg); dq8<T>(ru, j, wu); }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < n) {
                float x[8];
                load_x8<T>(X + (size_t)t * cols, j, in, lane, x);
                if (in) {
#pragma unroll
                    for (int i = 0; i < 8; i++) { ag[t] += wg[i] * x[i]; au[t] += wu[i] * x[i]; }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float g = warp_sum(ag[t]), u = warp_sum(au[t]);
        if (lane == 0 && t < n) G[(size_t)t * rows + r] = gate_act(g, act) * u;
    }
}

// The activation rounding of `act_round` for the tiled product's input: n rows of `cols`, one
// warp per 256-element chunk (KIND as in act_round). KIND 3: Q8_0 as int8 quants Xq[t·cols + k]
// and scales Xd[t·(cols/32) + k/32] (the int8 tensor-core product's input), else rounded floats.
template <int KIND>
__device__ __forceinline__ void act_quant_body(const float* X, void* Xq, float* Xd, int cols, int n) {
    PDL_ENTRY();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunks = (cols + 255) / 256;
    const int c = blockIdx.x * (blockDim.x >> 5) + warp;
    if (c >= chunks * n) return;
    const int t = c / chunks, j = (c % chunks) * 256 + lane * 8;
    const bool in = j < cols;
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = in ? X[(size_t)t * cols + j + i] : 0.f;
    if (KIND == 3) {
        float d, id;
        q8_0_scale(x, d, id);
        if (in) {
            *(uint2*)((int8_t*)Xq + (size_t)t * cols + j) = q8_0_pack(x, id);
            if ((lane & 3) == 0) Xd[(size_t)t * (cols >> 5) + (j >> 5)] = d;
        }
        return;
    }
    act_round<KIND>(x, lane);
    if (in) {
#pragma unroll
        for (int i = 0; i < 8; i++) ((float*)Xq)[(size_t)t * cols + j + i] = x[i];
    }
}
extern "C" __global__ void act_q8_0(const float* X, float* Xq, int cols, int n) { act_quant_body<1>(X, Xq, nullptr, cols, n); }
extern "C" __global__ void act_q8_k(const float* X, float* Xq, int cols, int n) { act_quant_body<2>(X, Xq, nullptr, cols, n); }
extern "C" __global__ void act_q8_0_i8(const float* X, int8_t* Xq, float* Xd, int cols, int n) { act_quant_body<3>(X, Xq, Xd, cols, n); }

// ---------------------------------------------------------------------------------------------
// Products for one token (decode): the block rounds the input once into shared memory (each
// warp one 256-element chunk at a time, exactly as `load_x8` rounds it), so the row loop has no
// shuffles but the final sum, and every warp pulls its weight rows into L2 before waiting for
// the previous kernel (PDL). Same arithmetic as `mmv_body`/`mmvg_body` with NT = 1.

#define MMV1_MAX_COLS 4096

template <int T>
__device__ __forceinline__ void stage_x(const float* X, float* xs, int cols) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int chunks = (cols + 255) / 256;
    for (int c = warp; c < chunks; c += warps) {
        const int j = c * 256 + lane * 8;
        const bool in = j < cols;
        float x[8];
        load_x8<T>(X, j, in, lane, x);
        if (in) {
            *(float4*)(xs + j) = make_float4(x[0], x[1], x[2], x[3]);
            *(float4*)(xs + j + 4) = make_float4(x[4], x[5], x[6], x[7]);
        }
    }
    __syncthreads();
}

// `stage_x` for a product whose input is the normed output of the residual step `r`: the block
// computes that step itself into xs, then rounds xs in place (each warp its own chunks).
template <int T>
__device__ __forceinline__ void stage_res(const Res& r, float* xs, int cols) {
    const bool first = blockIdx.x == 0;
    residual_body(r.x, first ? r.xo : nullptr, r.p, r.post, r.next, cols, r.eps, first ? r.xn : nullptr, xs);
    __syncthreads();
    stage_x<T>(xs, xs, cols);
}

__device__ __forceinline__ void ld_xs8(const float* xs, int j, float* x) {
    const float4 p = *(const float4*)(xs + j), q = *(const float4*)(xs + j + 4);
    x[0] = p.x; x[1] = p.y; x[2] = p.z; x[3] = p.w; x[4] = q.x; x[5] = q.y; x[6] = q.z; x[7] = q.w;
}

template <int T>
__device__ __forceinline__ void mmv1s_body(const Mmv3& a, const float* __restrict__ X, int cols, const Res& res) {
    __shared__ __align__(16) float xs[MMV1_MAX_COLS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    const u8* w0 = nullptr;
    long long rb = 0;
    float* y = nullptr;
    int rows = 0;
    const bool valid = mmv_pick(a, r, w0, rb, y, rows);
    const u8* row = valid ? w0 + (size_t)r * rb : nullptr;
    if (valid) prefetch_row(row, rb, lane);
    PDL_ENTRY();
    if (res.on) stage_res<T>(res, xs, cols);
    else stage_x<T>(X, xs, cols);
    if (!valid) return;
    float acc = 0.f;
#pragma unroll 2
    for (int j0 = 0; j0 < cols; j0 += 256) {
        const int j = j0 + lane * 8;
        if (j < cols) {
            float w[8], x[8];
            dq8<T>(row, j, w);
            ld_xs8(xs, j, x);
#pragma unroll
            for (int i = 0; i < 8; i++) acc += w[i] * x[i];
        }
    }
    const float s = warp_sum(acc);
    if (lane == 0) y[r] = s;
}

template <int T>
__device__ __forceinline__ void mmvg1s_body(const u8* __restrict__ Wg, const u8* __restrict__ Wu, long long rb, int rows, const float* __restrict__ X, int cols, float* __restrict__ G, int act,
                                            const Res& res) {
    __shared__ __align__(16) float xs[MMV1_MAX_COLS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + warp;
    const bool valid = r < rows;
    const u8* rg = Wg + (size_t)(valid ? r : 0) * rb;
    const u8* ru = Wu + (size_t)(valid ? r : 0) * rb;
    if (valid) {
        prefetch_row(rg, rb, lane);
        prefetch_row(ru, rb, lane);
    }
    PDL_ENTRY();
    if (res.on) stage_res<T>(res, xs, cols);
    else stage_x<T>(X, xs, cols);
    if (!valid) return;
    float ag = 0.f, au = 0.f;
#pragma unroll 2
    for (int j0 = 0; j0 < cols; j0 += 256) {
        const int j = j0 + lane * 8;
        if (j < cols) {
            float wg[8], wu[8], x[8];
            dq8<T>(rg, j, wg);
            dq8<T>(ru, j, wu);
            ld_xs8(xs, j, x);
#pragma unroll
            for (int i = 0; i < 8; i++) { ag += wg[i] * x[i]; au += wu[i] * x[i]; }
        }
    }
    const float g = warp_sum(ag), u = warp_sum(au);
    if (lane == 0) G[r] = gate_act(g, act) * u;
}

// ---------------------------------------------------------------------------------------------
// The LM head for one token over Q8_0 weights (uploaded as T_Q8_0R), with the greedy pick:
// logits Y[r] = W[r] · x, soft-capped when cap > 0, and out[0] = the largest non-NaN logit's
// row (lowest on ties). The input is rounded to Q8_0 once per block, as the CPU rounds it, and
// each 32-block's product is an exact integer (dp4a) times the two scales, as on the CPU. A
// persistent grid: each block takes tiles of 32 rows (4 per warp, their loads in flight
// together), keeps its best row, and the last block to finish picks among the blocks'.

#define HEAD_RPW 4
#define HEAD_TILE (8 * HEAD_RPW)
#define HEAD_MAX_COLS 2048

__device__ __forceinline__ void better(float& bv, int& bi, float v, int i);
__device__ __forceinline__ void block_best(float& bv, int& bi);

// The one-token LM heads' input staging: the norm (when nw; the head's row is the step's first
// head row, normed as `norm_rows` does it, the same sums in the same order) and Q8_0 rounding into
// shared memory.
__device__ __forceinline__ void head_stage_x(const float* __restrict__ X, int cols, const float* __restrict__ nw, float eps, const int* step, int mb, int8_t* xq, float* xd) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const float* xr = X;
    float rs = 1.f;
    if (nw) {
        __shared__ float red[32];
        xr = X + (size_t)step[4 + mb] * cols;
        float ss = 0.f;
        for (int j = threadIdx.x; j < cols; j += blockDim.x) ss += xr[j] * xr[j];
        rs = rsqrtf(block_sum(ss, red) / (float)cols + eps);
    }
    const int chunks = (cols + 255) / 256;
    for (int c = warp; c < chunks; c += warps) {
        const int j = c * 256 + lane * 8;
        const bool in = j < cols;
        float x[8];
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = in ? (nw ? xr[j + i] * rs * nw[j + i] : xr[j + i]) : 0.f;
        float d, id;
        q8_0_scale(x, d, id);
        if (in) {
            *(uint2*)(xq + j) = q8_0_pack(x, id);
            if ((lane & 3) == 0) xd[j >> 5] = d;
        }
    }
    __syncthreads();
}

// The blocks' best rows into pv/pi; the last block to finish writes the pick to out[0].
__device__ __forceinline__ void head_pick(float bv, int bi, float* pv, int* pi, unsigned int* counter, int* out, const int* step) {
    __shared__ bool last;
    block_best(bv, bi);
    if (threadIdx.x == 0) {
        pv[blockIdx.x] = bv;
        pi[blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float cv = -INFINITY;
    int ci = 0x7fffffff;
    // Four loads in flight per thread (the grid may have thousands of blocks).
    for (int b0 = threadIdx.x; b0 < (int)gridDim.x; b0 += blockDim.x * 4) {
        float vv[4];
        int ii[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int b = b0 + k * blockDim.x;
            vv[k] = b < (int)gridDim.x ? __ldcg(pv + b) : -INFINITY;
            ii[k] = b < (int)gridDim.x ? __ldcg(pi + b) : 0x7fffffff;
        }
#pragma unroll
        for (int k = 0; k < 4; k++) better(cv, ci, vv[k], ii[k]);
    }
    block_best(cv, ci);
    if (threadIdx.x == 0) {
        out[0] = ci == 0x7fffffff ? 0 : ci;
        if (step[3] & STEP_KEEP_PICK) out[2] = out[0];
        *counter = 0;
    }
}

extern "C" __global__ void __launch_bounds__(256) head_q8_0r(const u8* __restrict__ W, long long rb, int rows, const float* __restrict__ X, int cols, float* __restrict__ Y, float cap,
                                                              float* pv, int* pi, unsigned int* counter, int* out, const float* __restrict__ nw, float eps, const int* step, int mb) {
    __shared__ __align__(16) int8_t xq[HEAD_MAX_COLS];
    __shared__ float xd[HEAD_MAX_COLS / 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tiles = (rows + HEAD_TILE - 1) / HEAD_TILE;
    if (blockIdx.x < tiles) {
        const long long r0 = (long long)blockIdx.x * HEAD_TILE;
        const long long bytes = (long long)min(HEAD_TILE, rows - (int)r0) * rb;
        for (long long o = (long long)threadIdx.x * 128; o < bytes; o += 256 * 128) prefetch_l2(W + r0 * rb + o);
    }
    PDL_ENTRY();
    // With `nw`: X is the residual stream, normed here first.
    head_stage_x(X, cols, nw, eps, step, mb, xq, xd);
    const int chunks = (cols + 255) / 256;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int r0 = tile * HEAD_TILE + warp * HEAD_RPW;
        float acc[HEAD_RPW];
#pragma unroll
        for (int k = 0; k < HEAD_RPW; k++) acc[k] = 0.f;
        for (int c = 0; c < chunks; c++) {
            const int e = lane * 8, j = c * 256 + e;
            const bool in = j < cols;
            uint2 xv = make_uint2(0, 0);
            float dx = 0.f;
            if (in) {
                xv = *(const uint2*)(xq + j);
                dx = xd[j >> 5];
            }
            uint2 v[HEAD_RPW];
            float dw[HEAD_RPW];
#pragma unroll
            for (int k = 0; k < HEAD_RPW; k++) {
                const u8* ch = W + (size_t)(r0 + k) * rb + (size_t)c * 272;
                const bool ok = in && r0 + k < rows;
                v[k] = ok ? __ldcs((const uint2*)(ch + 16 + e)) : make_uint2(0, 0);
                dw[k] = ok ? __half2float(__ldcs((const __half*)ch + (e >> 5))) : 0.f;
            }
#pragma unroll
            for (int k = 0; k < HEAD_RPW; k++) {
                int si = __dp4a((int)v[k].x, (int)xv.x, 0);
                si = __dp4a((int)v[k].y, (int)xv.y, si);
                si += __shfl_xor_sync(0xffffffff, si, 1);
                si += __shfl_xor_sync(0xffffffff, si, 2);
                acc[k] += (float)si * (dw[k] * dx);
            }
        }
#pragma unroll
        for (int k = 0; k < HEAD_RPW; k++) {
            // Lanes 4q..4q+3 hold the same block sums: summing over lane bits 2..4 adds each of
            // the 32-blocks once.
            float a = acc[k];
            a += __shfl_xor_sync(0xffffffff, a, 4);
            a += __shfl_xor_sync(0xffffffff, a, 8);
            a += __shfl_xor_sync(0xffffffff, a, 16);
            if (cap > 0.f) a = tanhf(a / cap) * cap;
            const int r = r0 + k;
            if (r < rows) {
                if (lane == 0) Y[r] = a;
                better(bv, bi, a, r);
            }
        }
    }
    head_pick(bv, bi, pv, pi, counter, out, step);
}

// ---------------------------------------------------------------------------------------------
// The same LM head (same sums in the same order, so the same logits bit for bit and the same
// pick), laid out for bandwidth: each lane reads 16-byte pieces, and a row's 8 lanes together
// read 128 contiguous bytes per load. In chunk c of a row, lane q (0..7) of the row's eight
// reads quant bytes 16q.. and 128 + 16q..: the halves of 32-blocks q/2 and 4 + q/2; one shuffle
// between lanes q and q^1 completes both blocks' integer sums, and the lane keeps block
// g = 4·(q&1) + q/2 of every chunk. Its float sum over the chunks is the old kernel's per-lane
// sum for 32-block g (the same chain of multiply-adds), and the butterfly over the eight lanes
// pairs g with g^1, g^2, g^4 in the old order. A warp takes 4·RPL consecutive rows (each lane
// RPL of them, every load in flight together); the grid is persistent, sized to the GPU.

__device__ __forceinline__ uint4 ld_stream16(const u8* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ int dp4a4(uint4 a, uint4 b, int s) {
    s = __dp4a((int)a.x, (int)b.x, s);
    s = __dp4a((int)a.y, (int)b.y, s);
    s = __dp4a((int)a.z, (int)b.z, s);
    return __dp4a((int)a.w, (int)b.w, s);
}

#define HEAD2_MAX_NC 8

template <int NC, int RPL, int LD>
__device__ __forceinline__ void head2_body(const u8* __restrict__ W, long long rb, int rows, const float* __restrict__ X, int cols, float* __restrict__ Y, float cap, float* pv, int* pi,
                                           unsigned int* counter, int* out, const float* __restrict__ nw, float eps, const int* step, int mb) {
    __shared__ __align__(16) int8_t xq[NC * 256];
    __shared__ float xd[NC * 8];
    PDL_ENTRY();
    head_stage_x(X, cols, nw, eps, step, mb, xq, xd);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int q = lane & 7, sub = lane >> 3;
    const bool odd = q & 1;
    const int g = (odd ? 4 : 0) + (q >> 1);
    const int nb = cols >> 5;
    // The lane's activation pieces and its block's scale, per chunk (zero past the row).
    uint4 xa[NC], xb[NC];
    float dx[NC];
    bool va[NC], vb[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int nbc = nb - 8 * c;
        va[c] = (q >> 1) < nbc;
        vb[c] = 4 + (q >> 1) < nbc;
        xa[c] = va[c] ? *(const uint4*)(xq + c * 256 + 16 * q) : make_uint4(0, 0, 0, 0);
        xb[c] = vb[c] ? *(const uint4*)(xq + c * 256 + 128 + 16 * q) : make_uint4(0, 0, 0, 0);
        dx[c] = g < nbc ? xd[c * 8 + g] : 0.f;
    }
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    const int per_block = warps * 4 * RPL;
    const int tiles = (rows + per_block - 1) / per_block;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int r0 = tile * per_block + warp * 4 * RPL + sub;
        uint4 wa[RPL][NC], wb[RPL][NC];
        float dw[RPL][NC];
#pragma unroll
        for (int i = 0; i < RPL; i++) {
            const int r = r0 + 4 * i;
            const bool ok = r < rows;
            const u8* row = W + (size_t)(ok ? r : 0) * rb;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const u8* ch = row + c * 272;
                const uint4 z = make_uint4(0, 0, 0, 0);
                if (LD) {
                    wa[i][c] = ok && va[c] ? ld_stream16(ch + 16 + 16 * q) : z;
                    wb[i][c] = ok && vb[c] ? ld_stream16(ch + 144 + 16 * q) : z;
                } else {
                    wa[i][c] = ok && va[c] ? __ldcs((const uint4*)(ch + 16 + 16 * q)) : z;
                    wb[i][c] = ok && vb[c] ? __ldcs((const uint4*)(ch + 144 + 16 * q)) : z;
                }
                dw[i][c] = ok && (odd ? vb[c] : va[c]) ? __half2float(__ldcs((const __half*)ch + g)) : 0.f;
            }
        }
#pragma unroll
        for (int i = 0; i < RPL; i++) {
            float acc = 0.f;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int sa = dp4a4(wa[i][c], xa[c], 0), sb = dp4a4(wb[i][c], xb[c], 0);
                const int si = (odd ? sb : sa) + __shfl_xor_sync(0xffffffff, odd ? sa : sb, 1);
                acc += (float)si * (dw[i][c] * dx[c]);
            }
            acc += __shfl_xor_sync(0xffffffff, acc, 2);
            acc += __shfl_xor_sync(0xffffffff, acc, 4);
            acc += __shfl_xor_sync(0xffffffff, acc, 1);
            if (cap > 0.f) acc = tanhf(acc / cap) * cap;
            const int r = r0 + 4 * i;
            if (r < rows) {
                if (q == 0) Y[r] = acc;
                better(bv, bi, acc, r);
            }
        }
    }
    head_pick(bv, bi, pv, pi, counter, out, step);
}

#define HEAD2_ARGS                                                                                                                                                       \
    const u8 *__restrict__ W, long long rb, int rows, const float *__restrict__ X, int cols, float *__restrict__ Y, float cap, float *pv, int *pi, unsigned int *counter, \
        int *out, const float *__restrict__ nw, float eps, const int *step, int mb
#define HEAD2_CALL W, rb, rows, X, cols, Y, cap, pv, pi, counter, out, nw, eps, step, mb
#define HEAD2(nc) \
    extern "C" __global__ void __launch_bounds__(256) head2_q8_0r_##nc(HEAD2_ARGS) { head2_body<nc, 2, 1>(HEAD2_CALL); }
HEAD2(1)
HEAD2(2)
HEAD2(3)
HEAD2(4)
HEAD2(5)
HEAD2(6)
HEAD2(7)
HEAD2(8)

// ---------------------------------------------------------------------------------------------
// Tiled product for many tokens: a block computes 64 rows × 64 tokens, stepping 32 columns at a
// time through shared memory (weights dequantized once per tile).
// Y[t * ldy + r] = W[r, :] · X[t, :].

#define GB_M 64
#define GB_N 64
#define GB_K 32

template <int T>
__device__ __forceinline__ void gemm_body(const u8* __restrict__ W, long long rb, int rows, const float* __restrict__ X, int cols, float* __restrict__ Y, int ldy, int n) {
    __shared__ float Ws[GB_K][GB_M + 4];
    __shared__ float Xs[GB_K][GB_N + 4];
    PDL_ENTRY();
    const int tid = threadIdx.x;
    const int r0 = blockIdx.x * GB_M, t0 = blockIdx.y * GB_N;
    const int lr = tid >> 2, lk = (tid & 3) * 8;
    const int ty = tid >> 4, tx = tid & 15;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    for (int k0 = 0; k0 < cols; k0 += GB_K) {
        float w[8];
        if (r0 + lr < rows) {
            dq8<T>(W + (size_t)(r0 + lr) * rb, k0 + lk, w);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) Ws[lk + i][lr] = w[i];
        if (t0 + lr < n) {
            const float4* xp = (const float4*)(X + (size_t)(t0 + lr) * cols + k0 + lk);
            float4 p = xp[0], q = xp[1];
            Xs[lk + 0][lr] = p.x; Xs[lk + 1][lr] = p.y; Xs[lk + 2][lr] = p.z; Xs[lk + 3][lr] = p.w;
            Xs[lk + 4][lr] = q.x; Xs[lk + 5][lr] = q.y; Xs[lk + 6][lr] = q.z; Xs[lk + 7][lr] = q.w;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) Xs[lk + i][lr] = 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < GB_K; k++) {
            float4 a = *(const float4*)&Ws[k][ty * 4];
            float4 b = *(const float4*)&Xs[k][tx * 4];
            float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int r = r0 + ty * 4 + i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int t = t0 + tx * 4 + j;
            if (t < n) Y[(size_t)t * ldy + r] = acc[i][j];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tiled product on the int8 tensor cores, for weights in symmetric 32-blocks (Q8_0 as uploaded,
// Q5_0, Q4_0):
// per 32-column block, the exact integer product of the weight quants and the activations' Q8_0
// quants (WMMA m16n16k16 s8 → s32, two steps), times the two scales, summed in f32 block after
// block: the CPU's arithmetic (and `head_q8_0r`'s). A block computes 64 rows × 64 tokens; warp w
// takes rows 16·(w/2).. and tokens 32·(w%2)..; each block's integer tile goes through shared
// memory, where every lane scales and adds its 16 elements (the fragment's layout is the
// library's own).

// The quants and scale of elements j..j+7 (j a multiple of 8) of one row.
template <int T> __device__ __forceinline__ void qq8(const u8* row, int j, int8_t* q, float& d);
template <> __device__ __forceinline__ void qq8<T_Q8_0R>(const u8* row, int j, int8_t* q, float& d) {
    const u8* c = row + (size_t)(j >> 8) * 272;
    const int e = j & 255;
    d = __half2float(((const __half*)c)[e >> 5]);
    const uint2 v = *(const uint2*)(c + 16 + e);
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = (int8_t)((v.x >> (8 * i)) & 0xFF);
#pragma unroll
    for (int i = 0; i < 4; i++) q[4 + i] = (int8_t)((v.y >> (8 * i)) & 0xFF);
}
template <> __device__ __forceinline__ void qq8<T_Q4_0>(const u8* row, int j, int8_t* q, float& d) {
    const u8* b = row + (size_t)(j >> 5) * 18;
    d = ldh(b);
    const int o = j & 31;
    const u8* qs = b + 2 + (o & 15);
    const int sh = o < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = (int8_t)(((qs[i] >> sh) & 0xF) - 8);
}
template <> __device__ __forceinline__ void qq8<T_Q5_0>(const u8* row, int j, int8_t* q, float& d) {
    const u8* b = row + (size_t)(j >> 5) * 22;
    d = ldh(b);
    const uint32_t qh = ld32u(b + 2);
    const int o = j & 31;
    const u8* qs = b + 6 + (o & 15);
    const int sh = o < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = (int8_t)((((qs[i] >> sh) & 0xF) | (((qh >> (o + i)) & 1) << 4)) - 16);
}

template <int T>
__device__ __forceinline__ void gemm_mma_body(const u8* __restrict__ W, long long rb, int rows, const int8_t* __restrict__ Xq, const float* __restrict__ Xd, int cols, float* __restrict__ Y,
                                              int ldy, int n) {
    using namespace nvcuda;
    PDL_ENTRY();
    // Each 32-block in two 16-column halves (WMMA wants 32-byte aligned tiles).
    __shared__ __align__(32) int8_t Ws[2][64][16];
    __shared__ __align__(32) int8_t Xs[2][64][16];
    __shared__ float Wd[64], Xds[64];
    __shared__ __align__(32) int Cs[8][16][32];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int r0 = blockIdx.x * 64, t0 = blockIdx.y * 64;
    const int wr = (warp >> 1) * 16, wt = (warp & 1) * 32;
    const int lr = tid >> 2, part = tid & 3;  // the loader's row (or token) and 8-element part
    const int nb = cols >> 5;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i] = 0.f;
    for (int blk = 0; blk < nb; blk++) {
        const int k0 = blk * 32;
        int8_t q[8];
        float d = 0.f;
        if (r0 + lr < rows) {
            qq8<T>(W + (size_t)(r0 + lr) * rb, k0 + part * 8, q, d);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) q[i] = 0;
        }
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo |= ((uint32_t)(uint8_t)q[i]) << (8 * i);
            hi |= ((uint32_t)(uint8_t)q[4 + i]) << (8 * i);
        }
        *(uint2*)&Ws[part >> 1][lr][(part & 1) * 8] = make_uint2(lo, hi);
        if (part == 0) Wd[lr] = d;
        uint2 xv = make_uint2(0, 0);
        float dx = 0.f;
        if (t0 + lr < n) {
            xv = *(const uint2*)(Xq + (size_t)(t0 + lr) * cols + k0 + part * 8);
            dx = Xd[(size_t)(t0 + lr) * nb + blk];
        }
        *(uint2*)&Xs[part >> 1][lr][(part & 1) * 8] = xv;
        if (part == 0) Xds[lr] = dx;
        __syncthreads();
        wmma::fragment<wmma::accumulator, 16, 16, 16, int> c[2];
        wmma::fill_fragment(c[0], 0);
        wmma::fill_fragment(c[1], 0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> a;
            wmma::load_matrix_sync(a, &Ws[h][wr][0], 16);
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::col_major> b;
                wmma::load_matrix_sync(b, &Xs[h][wt + tt * 16][0], 16);
                wmma::mma_sync(c[tt], a, b, c[tt]);
            }
        }
        wmma::store_matrix_sync(&Cs[warp][0][0], c[0], 32, wmma::mem_row_major);
        wmma::store_matrix_sync(&Cs[warp][0][16], c[1], 32, wmma::mem_row_major);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int e = lane + 32 * i, r = e >> 5, t = e & 31;
            acc[i] += (float)Cs[warp][r][t] * (Wd[wr + r] * Xds[wt + t]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int e = lane + 32 * i, r = r0 + wr + (e >> 5), t = t0 + wt + (e & 31);
        if (r < rows && t < n) Y[(size_t)t * ldy + r] = acc[i];
    }
}
#define INSTANTIATE_MMA(T, name) \
    extern "C" __global__ void __launch_bounds__(256) gemm_mma_##name(const u8* W, long long rb, int rows, const int8_t* Xq, const float* Xd, int cols, float* Y, int ldy, int n) { \
        gemm_mma_body<T>(W, rb, rows, Xq, Xd, cols, Y, ldy, n); \
    }
INSTANTIATE_MMA(T_Q8_0R, q8_0r)
INSTANTIATE_MMA(T_Q4_0, q4_0)
INSTANTIATE_MMA(T_Q5_0, q5_0)

// ---------------------------------------------------------------------------------------------
// MMQ: many-token products on the int8 tensor cores with every scale applied in registers (as
// llama.cpp's mmq.cuh does), for Q8_0 (as uploaded), Q5_0, Q4_0, Q4_K and Q6_K weights.
// Activations come quantized by `act_mq_*`: int8 quants Xq[t·cols + k] and, per 32-block, the
// scale Xd[t·(cols/32) + b] and the scale times the block's quant sum Xm (for Q4_K's mins).
// Per 32-block (16 for Q6_K's scales) the exact integer product of weight and activation quants
// (mma.sync m16n8k32 / m16n8k16 s8 → s32) is scaled by both scales and summed in f32, block after
// block: the CPU's arithmetic. A block of 128 threads computes 64 rows × BN tokens, staging 128
// columns at a time (weights converted to int8 in shared memory); warp w takes rows 32·(w/2)..
// and tokens (BN/2)·(w%2).., as 2 × BN/16 tiles of 16 × 8. One launch serves up to three weights
// of one type and width (`Mmv3`: blockIdx.x numbers their 64-row tiles one after the other).

#define MQ_BM 64
#define MQ_BK 128
#define MQ_LD (MQ_BK + 16)  // bytes per staged row: 36 words, so a fragment's 8 rows × 4 words hit 32 banks

template <int T> struct Mq { static const int sub = 32; static const bool mins = false; };
template <> struct Mq<T_Q4_K> { static const int sub = 32; static const bool mins = true; };
template <> struct Mq<T_Q6_K> { static const int sub = 16; static const bool mins = false; };

// Four 4-bit high parts (bits of h) moved to bit 4 of each byte.
__device__ __forceinline__ uint32_t mq_spread4(uint32_t h) { return ((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25); }
__device__ __forceinline__ uint32_t pk16(uint16_t a, uint16_t b) { return (uint32_t)a | ((uint32_t)b << 16); }
__device__ __forceinline__ float h2f(uint16_t v) { return __half2float(__ushort_as_half(v)); }

// 32-block `b` of one row, in two steps so that the loads of the next stage can be in flight
// while the tensor cores work on this one: `load` only reads the block's bytes into registers,
// `get` makes its 32 quants as int8 (q, four to a word), scale (dw[1]: the second 16's, Q6_K)
// and min (Q4_K: the weight is dw·q − mw).
template <int T> struct MqRaw;
template <> struct MqRaw<T_Q8_0R> {
    uint4 u, v;
    uint16_t d;
    __device__ __forceinline__ void load(const u8* row, int b) {
        const u8* c = row + (size_t)(b >> 3) * 272;
        const int k = b & 7;
        d = ((const uint16_t*)c)[k];
        const uint4* p = (const uint4*)(c + 16 + 32 * k);
        u = p[0];
        v = p[1];
    }
    __device__ __forceinline__ void get(int b, uint32_t* q, float* dw, float& mw) const {
        dw[0] = h2f(d);
        q[0] = u.x; q[1] = u.y; q[2] = u.z; q[3] = u.w; q[4] = v.x; q[5] = v.y; q[6] = v.z; q[7] = v.w;
    }
};
template <> struct MqRaw<T_Q4_0> {
    uint16_t s[9];
    __device__ __forceinline__ void load(const u8* row, int b) {
        const uint16_t* p = (const uint16_t*)(row + (size_t)b * 18);
#pragma unroll
        for (int i = 0; i < 9; i++) s[i] = p[i];
    }
    __device__ __forceinline__ void get(int b, uint32_t* q, float* dw, float& mw) const {
        dw[0] = h2f(s[0]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = pk16(s[1 + 2 * i], s[2 + 2 * i]);
            q[i] = __vsub4(w & 0x0F0F0F0F, 0x08080808);
            q[4 + i] = __vsub4((w >> 4) & 0x0F0F0F0F, 0x08080808);
        }
    }
};
template <> struct MqRaw<T_Q5_0> {
    uint16_t s[11];
    __device__ __forceinline__ void load(const u8* row, int b) {
        const uint16_t* p = (const uint16_t*)(row + (size_t)b * 22);
#pragma unroll
        for (int i = 0; i < 11; i++) s[i] = p[i];
    }
    __device__ __forceinline__ void get(int b, uint32_t* q, float* dw, float& mw) const {
        dw[0] = h2f(s[0]);
        const uint32_t qh = pk16(s[1], s[2]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = pk16(s[3 + 2 * i], s[4 + 2 * i]);
            q[i] = __vsub4((w & 0x0F0F0F0F) | mq_spread4(qh >> (4 * i)), 0x10101010);
            q[4 + i] = __vsub4(((w >> 4) & 0x0F0F0F0F) | mq_spread4(qh >> (16 + 4 * i)), 0x10101010);
        }
    }
};
template <> struct MqRaw<T_Q4_K> {
    uint4 u, v;
    uint32_t dd, sc[3];
    __device__ __forceinline__ void load(const u8* row, int b) {
        const u8* s = row + (size_t)(b >> 3) * 144;
        const uint32_t* w = (const uint32_t*)s;
        dd = w[0];
        sc[0] = w[1];
        sc[1] = w[2];
        sc[2] = w[3];
        const uint4* p = (const uint4*)(s + 16 + 32 * ((b & 7) >> 1));
        u = p[0];
        v = p[1];
    }
    __device__ __forceinline__ void get(int b, uint32_t* q, float* dw, float& mw) const {
        const int j = b & 7;
        // ggml's get_scale_min_k4 on the 12 scale bytes held in sc[0..2].
        auto byte = [&](int k) -> uint32_t {
            const uint32_t w = k < 4 ? sc[0] : (k < 8 ? sc[1] : sc[2]);
            return (w >> (8 * (k & 3))) & 0xFF;
        };
        float s, m;
        if (j < 4) {
            s = (float)(byte(j) & 63);
            m = (float)(byte(j + 4) & 63);
        } else {
            s = (float)((byte(j + 4) & 0xF) | ((byte(j - 4) >> 6) << 4));
            m = (float)((byte(j + 4) >> 4) | ((byte(j) >> 6) << 4));
        }
        dw[0] = h2f((uint16_t)(dd & 0xFFFF)) * s;
        mw = h2f((uint16_t)(dd >> 16)) * m;
        const int sh = (j & 1) * 4;
        q[0] = (u.x >> sh) & 0x0F0F0F0F; q[1] = (u.y >> sh) & 0x0F0F0F0F; q[2] = (u.z >> sh) & 0x0F0F0F0F; q[3] = (u.w >> sh) & 0x0F0F0F0F;
        q[4] = (v.x >> sh) & 0x0F0F0F0F; q[5] = (v.y >> sh) & 0x0F0F0F0F; q[6] = (v.z >> sh) & 0x0F0F0F0F; q[7] = (v.w >> sh) & 0x0F0F0F0F;
    }
};
template <> struct MqRaw<T_Q6_K> {
    uint16_t l[16], h[16], sc, d;
    __device__ __forceinline__ void load(const u8* row, int b) {
        const u8* s = row + (size_t)(b >> 3) * 210;
        const int j = b & 7, hf = j >> 2, qq = j & 3;
        const uint16_t* ql = (const uint16_t*)(s + 64 * hf + 32 * (qq & 1));
        const uint16_t* qh = (const uint16_t*)(s + 128 + 32 * hf);
#pragma unroll
        for (int i = 0; i < 16; i++) l[i] = ql[i];
#pragma unroll
        for (int i = 0; i < 16; i++) h[i] = qh[i];
        sc = *(const uint16_t*)(s + 192 + 8 * hf + 2 * qq);
        d = *(const uint16_t*)(s + 208);
    }
    __device__ __forceinline__ void get(int b, uint32_t* q, float* dw, float& mw) const {
        const int qq = b & 3, sh = (qq >> 1) * 4, hs = 2 * qq;
        const float dd = h2f(d);
        dw[0] = dd * (float)(int8_t)(sc & 0xFF);
        dw[1] = dd * (float)(int8_t)(sc >> 8);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t lo = pk16(l[2 * i], l[2 * i + 1]), hb = pk16(h[2 * i], h[2 * i + 1]);
            q[i] = __vsub4(((lo >> sh) & 0x0F0F0F0F) | (((hb >> hs) & 0x03030303) << 4), 0x20202020);
        }
    }
};

__device__ __forceinline__ void mma_k32(int* c, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
__device__ __forceinline__ void mma_k16(int* c, uint32_t a0, uint32_t a1, uint32_t b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
#endif
}

// Tile `tile` (numbered across the three weights) of `a`: its weight, row bytes, output and row
// count, with `tile` made relative to that weight; false past the last tile.
__device__ __forceinline__ bool mq_pick(const Mmv3& a, int& tile, const u8*& w, long long& rb, float*& y, int& rows) {
    const int t0 = (a.rows[0] + MQ_BM - 1) / MQ_BM, t1 = (a.rows[1] + MQ_BM - 1) / MQ_BM, t2 = (a.rows[2] + MQ_BM - 1) / MQ_BM;
    if (tile < t0) { w = a.w[0]; rb = a.rb[0]; y = a.y[0]; rows = a.rows[0]; }
    else if (tile - t0 < t1) { tile -= t0; w = a.w[1]; rb = a.rb[1]; y = a.y[1]; rows = a.rows[1]; }
    else if (tile - t0 - t1 < t2) { tile -= t0 + t1; w = a.w[2]; rb = a.rb[2]; y = a.y[2]; rows = a.rows[2]; }
    else return false;
    return true;
}

// PIPE: the next stage's bytes are read into registers before this stage's products (one
// stage ahead); else each stage is read, converted and stored before its products. KS: warp
// groups that split each stage's 32-blocks between them (128·KS threads; more warps in flight
// for the same tile), their sums added through shared memory at the end.
template <int T, int BN, bool PIPE, int KS>
__device__ __forceinline__ void mmq_body(const Mmv3& a, const int8_t* __restrict__ Xq, const float* __restrict__ Xd, const float* __restrict__ Xm, int cols, int n) {
    constexpr int SUB = Mq<T>::sub;
    constexpr bool MINS = Mq<T>::mins;
    constexpr int NT = BN / 16;        // 8-token tiles per warp
    constexpr int NTH = 128 * KS;
    constexpr int WI = MQ_BM * 4 / NTH;       // (row, 32-block) weight pairs per thread and stage
    constexpr int XV = BN * 8 / NTH;          // 16-byte activation pieces per thread and stage
    constexpr int XS = (BN * 4 + NTH - 1) / NTH;  // activation scales per thread and stage
    static_assert(XV >= 1 && WI >= 1, "tile too small for the threads");
    __shared__ __align__(16) int8_t Sm[(MQ_BM + BN) * MQ_LD];
    int8_t* Ws = Sm;
    int8_t* Xs = Sm + MQ_BM * MQ_LD;
    __shared__ float Wd[2 * MQ_BK / 32][MQ_BM];  // [32-block · 2 + half][row]
    __shared__ float Wm[MQ_BK / 32][MQ_BM];
    __shared__ float Xds[MQ_BK / 32][BN], Xms[MQ_BK / 32][BN];
    int tile = blockIdx.x;
    const u8* W;
    long long rb;
    float* Y;
    int rows;
    if (!mq_pick(a, tile, W, rb, Y, rows)) {
        PDL_ENTRY();
        return;
    }
    PDL_ENTRY();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int r0 = tile * MQ_BM, t0 = blockIdx.y * BN;
    const int kg = warp >> 2, w4 = warp & 3;  // the warp's group (32-blocks kg, kg + KS, ..) and place
    const int wr = (w4 >> 1) * 32, wt = (w4 & 1) * (BN / 2);
    const int nbt = cols >> 5;
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][j][i] = 0.f;
    // One stage in registers: two (row, 32-block) pairs of weights per thread, XV activation
    // pieces and XS of their scales.
    MqRaw<T> raw[WI];
    uint4 xv[XV];
    float xd[XS], xm[XS];
    auto load = [&](int b0) {
        const int nb = min(MQ_BK / 32, nbt - b0);
#pragma unroll
        for (int it = 0; it < WI; it++) {
            const int i = tid + it * NTH, r = i >> 2, kb = i & 3;
            if (kb < nb && r0 + r < rows) raw[it].load(W + (size_t)(r0 + r) * rb, b0 + kb);
        }
#pragma unroll
        for (int it = 0; it < XV; it++) {
            const int i = tid + it * NTH, tk = i >> 3, c = i & 7;
            xv[it] = make_uint4(0, 0, 0, 0);
            if (t0 + tk < n && c < 2 * nb) xv[it] = *(const uint4*)(Xq + (size_t)(t0 + tk) * cols + b0 * 32 + c * 16);
        }
#pragma unroll
        for (int it = 0; it < XS; it++) {
            const int i = tid + it * NTH, tk = i >> 2, kb = i & 3;
            const bool in = i < BN * 4 && t0 + tk < n && kb < nb;
            xd[it] = in ? Xd[(size_t)(t0 + tk) * nbt + b0 + kb] : 0.f;
            if (MINS) xm[it] = in ? Xm[(size_t)(t0 + tk) * nbt + b0 + kb] : 0.f;
        }
    };
    auto store = [&](int b0) {
        const int nb = min(MQ_BK / 32, nbt - b0);
#pragma unroll
        for (int it = 0; it < WI; it++) {
            const int i = tid + it * NTH, r = i >> 2, kb = i & 3;
            uint32_t q[8];
            float dw[2] = {0.f, 0.f}, mw = 0.f;
            if (kb < nb && r0 + r < rows) {
                raw[it].get(b0 + kb, q, dw, mw);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) q[k] = 0;
            }
            uint4* dst = (uint4*)(Ws + r * MQ_LD + kb * 32);
            dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
            dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
            Wd[2 * kb][r] = dw[0];
            if (SUB == 16) Wd[2 * kb + 1][r] = dw[1];
            if (MINS) Wm[kb][r] = mw;
        }
#pragma unroll
        for (int it = 0; it < XV; it++) {
            const int i = tid + it * NTH, tk = i >> 3, c = i & 7;
            *(uint4*)(Xs + tk * MQ_LD + c * 16) = xv[it];
        }
#pragma unroll
        for (int it = 0; it < XS; it++) {
            const int i = tid + it * NTH, tk = i >> 2, kb = i & 3;
            if (i < BN * 4) {
                Xds[kb][tk] = xd[it];
                if (MINS) Xms[kb][tk] = xm[it];
            }
        }
    };
    if (PIPE) load(0);
    for (int b0 = 0; b0 < nbt; b0 += MQ_BK / 32) {
        const int nb = min(MQ_BK / 32, nbt - b0);
        if (!PIPE) load(b0);
        store(b0);
        __syncthreads();
        if (PIPE && b0 + MQ_BK / 32 < nbt) load(b0 + MQ_BK / 32);
        for (int kb = kg; kb < nb; kb += KS) {
            uint32_t af[2][4], bf[NT][2];
            float dwr[2][2], dwr2[2][2], mwr[2][2], dxt[NT][2], xmt[NT][2];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                const int r = wr + m * 16 + g;
                const int8_t* p = Ws + r * MQ_LD + kb * 32 + t4 * 4;
                af[m][0] = *(const uint32_t*)p;
                af[m][1] = *(const uint32_t*)(p + 8 * MQ_LD);
                af[m][2] = *(const uint32_t*)(p + 16);
                af[m][3] = *(const uint32_t*)(p + 8 * MQ_LD + 16);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    dwr[m][h] = Wd[2 * kb][r + 8 * h];
                    if (SUB == 16) dwr2[m][h] = Wd[2 * kb + 1][r + 8 * h];
                    if (MINS) mwr[m][h] = Wm[kb][r + 8 * h];
                }
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int tk = wt + j * 8 + g;
                const int8_t* p = Xs + tk * MQ_LD + kb * 32 + t4 * 4;
                bf[j][0] = *(const uint32_t*)p;
                bf[j][1] = *(const uint32_t*)(p + 16);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    dxt[j][e] = Xds[kb][wt + j * 8 + 2 * t4 + e];
                    if (MINS) xmt[j][e] = Xms[kb][wt + j * 8 + 2 * t4 + e];
                }
            }
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (SUB == 32) {
                        int c[4] = {0, 0, 0, 0};
                        mma_k32(c, af[m], bf[j]);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            acc[m][j][i] = fmaf((float)c[i], dwr[m][i >> 1] * dxt[j][i & 1], acc[m][j][i]);
                            if (MINS) acc[m][j][i] = fmaf(-mwr[m][i >> 1], xmt[j][i & 1], acc[m][j][i]);
                        }
                    } else {
                        int c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
                        mma_k16(c0, af[m][0], af[m][1], bf[j][0]);
                        mma_k16(c1, af[m][2], af[m][3], bf[j][1]);
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            acc[m][j][i] = fmaf((float)c0[i] * dwr[m][i >> 1] + (float)c1[i] * dwr2[m][i >> 1], dxt[j][i & 1], acc[m][j][i]);
                    }
                }
        }
        __syncthreads();
    }
    if (KS > 1) {
        // The other groups' sums into group 0's, through the staging memory (free now).
        float* red = (float*)Sm;  // [group - 1][element][128 lanes of the group]
        static_assert((KS - 1) * 2 * NT * 4 * 128 * 4 <= (MQ_BM + BN) * MQ_LD, "reduction does not fit");
        if (kg > 0) {
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) red[(((kg - 1) * 2 * NT + m * NT + j) * 4 + i) * 128 + w4 * 32 + lane] = acc[m][j][i];
        }
        __syncthreads();
        if (kg > 0) return;
#pragma unroll
        for (int k = 1; k < KS; k++)
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[m][j][i] += red[(((k - 1) * 2 * NT + m * NT + j) * 4 + i) * 128 + w4 * 32 + lane];
    }
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = r0 + wr + m * 16 + g + 8 * (i >> 1), tk = t0 + wt + j * 8 + 2 * t4 + (i & 1);
                if (r < rows && tk < n) Y[(size_t)tk * rows + r] = acc[m][j][i];
            }
}
// mmq{32,64}: 128 threads; mmq{32,64}k2: two warp groups (256 threads), for grids too small
// to fill the GPU.
#define INSTANTIATE_MMQ(T, name) \
    extern "C" __global__ void __launch_bounds__(128) mmq32_##name(Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) { mmq_body<T, 32, true, 1>(a, Xq, Xd, Xm, cols, n); } \
    extern "C" __global__ void __launch_bounds__(128) mmq64_##name(Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) { mmq_body<T, 64, true, 1>(a, Xq, Xd, Xm, cols, n); } \
    extern "C" __global__ void __launch_bounds__(256) mmq32k2_##name(Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) { mmq_body<T, 32, true, 2>(a, Xq, Xd, Xm, cols, n); } \
    extern "C" __global__ void __launch_bounds__(256) mmq64k2_##name(Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) { mmq_body<T, 64, true, 2>(a, Xq, Xd, Xm, cols, n); }
// Decode-size batches (2..NMAX tokens) when an MMQ grid would leave most multiprocessors idle:
// one warp per weight row (rows numbered across the three weights), the lanes taking its
// 32-blocks in turn, the int8 activations as `act_mq_*` left them (read through L1), four
// bytes per `dp4a`, each 32-block's sum scaled as the MMQ kernels scale it.
template <int T, int NMAX>
__device__ __forceinline__ void mmvq_body(const Mmv3& a, const int8_t* __restrict__ Xq, const float* __restrict__ Xd, const float* __restrict__ Xm, int cols, int n) {
    PDL_ENTRY();
    constexpr int SUB = Mq<T>::sub;
    constexpr bool MINS = Mq<T>::mins;
    const int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), k = 0;
    if (r >= a.rows[0]) { r -= a.rows[0]; k = 1; if (r >= a.rows[1]) { r -= a.rows[1]; k = 2; if (r >= a.rows[2]) return; } }
    const u8* row = a.w[k] + (size_t)r * a.rb[k];
    const int nbt = cols >> 5;
    float acc[NMAX];
#pragma unroll
    for (int t = 0; t < NMAX; t++) acc[t] = 0.f;
    for (int b = lane; b < nbt; b += 32) {
        MqRaw<T> raw;
        raw.load(row, b);
        uint32_t q[8];
        float dw[2] = {0.f, 0.f}, mw = 0.f;
        raw.get(b, q, dw, mw);
#pragma unroll
        for (int t = 0; t < NMAX; t++) {
            if (t >= n) break;
            const int4* xp = (const int4*)(Xq + (size_t)t * cols + b * 32);
            const int4 x0 = xp[0], x1 = xp[1];
            const float xd = Xd[(size_t)t * nbt + b];
            int s0 = __dp4a((int)q[0], x0.x, 0);
            s0 = __dp4a((int)q[1], x0.y, s0);
            s0 = __dp4a((int)q[2], x0.z, s0);
            s0 = __dp4a((int)q[3], x0.w, s0);
            int s1 = __dp4a((int)q[4], x1.x, 0);
            s1 = __dp4a((int)q[5], x1.y, s1);
            s1 = __dp4a((int)q[6], x1.z, s1);
            s1 = __dp4a((int)q[7], x1.w, s1);
            if (SUB == 32) {
                acc[t] = fmaf((float)(s0 + s1), dw[0] * xd, acc[t]);
                if (MINS) acc[t] = fmaf(-mw, Xm[(size_t)t * nbt + b], acc[t]);
            } else {
                acc[t] = fmaf((float)s0 * dw[0] + (float)s1 * dw[1], xd, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NMAX; t++) {
        if (t >= n) break;
        const float v = warp_sum(acc[t]);
        if (lane == 0) a.y[k][(size_t)t * a.rows[k] + r] = v;
    }
}
#define INSTANTIATE_MMVQ(T, name) \
    extern "C" __global__ void __launch_bounds__(256) mmvq4_##name(Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) { mmvq_body<T, 4>(a, Xq, Xd, Xm, cols, n); } \
    extern "C" __global__ void __launch_bounds__(256) mmvq8_##name(Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) { mmvq_body<T, 8>(a, Xq, Xd, Xm, cols, n); } \
    extern "C" __global__ void __launch_bounds__(256) mmvq16_##name(Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) { mmvq_body<T, 16>(a, Xq, Xd, Xm, cols, n); }
INSTANTIATE_MMVQ(T_Q8_0R, q8_0r)
INSTANTIATE_MMVQ(T_Q4_0, q4_0)
INSTANTIATE_MMVQ(T_Q5_0, q5_0)
INSTANTIATE_MMVQ(T_Q4_K, q4_k)
INSTANTIATE_MMVQ(T_Q6_K, q6_k)

INSTANTIATE_MMQ(T_Q8_0R, q8_0r)
INSTANTIATE_MMQ(T_Q4_0, q4_0)
INSTANTIATE_MMQ(T_Q5_0, q5_0)
INSTANTIATE_MMQ(T_Q4_K, q4_k)
INSTANTIATE_MMQ(T_Q6_K, q6_k)

// The MMQ kernels' activations (see above): one warp per 256-element chunk. KIND 1: Q8_0 (a
// scale per 32-block), 2: Q8_K (one scale per 256, repeated for its eight 32-blocks); the
// quants are those `act_round` rounds to.
template <int KIND>
__device__ __forceinline__ void act_mq_body(const float* X, int8_t* Xq, float* Xd, float* Xm, int cols, int n) {
    PDL_ENTRY();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunks = (cols + 255) / 256;
    const int c = blockIdx.x * (blockDim.x >> 5) + warp;
    if (c >= chunks * n) return;
    const int t = c / chunks, j = (c % chunks) * 256 + lane * 8;
    const bool in = j < cols;
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = in ? X[(size_t)t * cols + j + i] : 0.f;
    float d = 0.f;
    uint2 pk = make_uint2(0, 0);
    if (KIND == 1) {
        float id;
        q8_0_scale(x, d, id);
        pk = q8_0_pack(x, id);
    } else {
        float amax = 0.f, mx = 0.f;
        int idx = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); mx = x[i]; idx = lane * 8 + i; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float oa = __shfl_xor_sync(0xffffffff, amax, o), om = __shfl_xor_sync(0xffffffff, mx, o);
            const int oi = __shfl_xor_sync(0xffffffff, idx, o);
            if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
        }
        if (amax != 0.f) {
            const float iscale = -127.f / mx;
            d = 1.f / iscale;
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) lo |= ((uint32_t)(min(127, __float2int_rn(iscale * x[i])) & 0xFF)) << (8 * i);
#pragma unroll
            for (int i = 0; i < 4; i++) hi |= ((uint32_t)(min(127, __float2int_rn(iscale * x[4 + i])) & 0xFF)) << (8 * i);
            pk = make_uint2(lo, hi);
        }
    }
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) s += (int)(int8_t)(pk.x >> (8 * i)) + (int)(int8_t)(pk.y >> (8 * i));
    s += __shfl_xor_sync(0xffffffff, s, 1);
    s += __shfl_xor_sync(0xffffffff, s, 2);
    if (in) {
        *(uint2*)(Xq + (size_t)t * cols + j) = pk;
        if ((lane & 3) == 0) {
            Xd[(size_t)t * (cols >> 5) + (j >> 5)] = d;
            Xm[(size_t)t * (cols >> 5) + (j >> 5)] = d * (float)s;
        }
    }
}
extern "C" __global__ void act_mq_q8_0(const float* X, int8_t* Xq, float* Xd, float* Xm, int cols, int n) { act_mq_body<1>(X, Xq, Xd, Xm, cols, n); }
extern "C" __global__ void act_mq_q8_k(const float* X, int8_t* Xq, float* Xd, float* Xm, int cols, int n) { act_mq_body<2>(X, Xq, Xd, Xm, cols, n); }

// The pass's token t: the step block's, or for t = 0 under STEP_TOKEN_PICK the kept pick.
__device__ __forceinline__ int step_token(const int* step, const int* pick, int t) {
    return t == 0 && (step[3] & STEP_TOKEN_PICK) ? pick[0] : step[4 + t];
}

// Embedding rows: X[t] = scale · table[tokens[t]], the token equal to `replace_id` taking
// `replace` (when given) instead.
template <int T>
__device__ __forceinline__ void embed_body(const u8* table, long long rb, const int* step, float* X, int d, float scale, const float* replace, int replace_id, const int* pick) {
    PDL_ENTRY();
    const int t = blockIdx.x;
    const int tok = step_token(step, pick, t);
    float* out = X + (size_t)t * d;
    if (replace && tok == replace_id) {
        for (int j = threadIdx.x; j < d; j += blockDim.x) out[j] = replace[j] * scale;
        return;
    }
    const u8* row = table + (size_t)tok * rb;
    for (int j = threadIdx.x * 8; j < d; j += blockDim.x * 8) {
        float w[8];
        dq8<T>(row, j, w);
#pragma unroll
        for (int i = 0; i < 8; i++) out[j + i] = w[i] * scale;
    }
}

#define INSTANTIATE(T, name)                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) mmv1_##name(Mmv3 a, const float* X, int cols, int n) { mmv_body<T, 1>(a, X, cols, n); } \
    extern "C" __global__ void __launch_bounds__(256) mmv2_##name(Mmv3 a, const float* X, int cols, int n) { mmv_body<T, 2>(a, X, cols, n); } \
    extern "C" __global__ void __launch_bounds__(256) mmv4_##name(Mmv3 a, const float* X, int cols, int n) { mmv_body<T, 4>(a, X, cols, n); } \
    extern "C" __global__ void __launch_bounds__(256) mmv8_##name(Mmv3 a, const float* X, int cols, int n) { mmv_body<T, 8>(a, X, cols, n); } \
    extern "C" __global__ void __launch_bounds__(256) mmvg1_##name(const u8* Wg, const u8* Wu, long long rb, int rows, const float* X, int cols, float* G, int n, int act) { mmvg_body<T, 1>(Wg, Wu, rb, rows, X, cols, G, n, act); } \
    extern "C" __global__ void __launch_bounds__(256) mmv1s_##name(Mmv3 a, const float* X, int cols, Res r) { mmv1s_body<T>(a, X, cols, r); } \
    extern "C" __global__ void __launch_bounds__(256) mmvg1s_##name(const u8* Wg, const u8* Wu, long long rb, int rows, const float* X, int cols, float* G, int act, Res r) { mmvg1s_body<T>(Wg, Wu, rb, rows, X, cols, G, act, r); } \
    extern "C" __global__ void __launch_bounds__(256) mmvg8_##name(const u8* Wg, const u8* Wu, long long rb, int rows, const float* X, int cols, float* G, int n, int act) { mmvg_body<T, 8>(Wg, Wu, rb, rows, X, cols, G, n, act); } \
    extern "C" __global__ void __launch_bounds__(256) gemm_##name(const u8* W, long long rb, int rows, const float* X, int cols, float* Y, int ldy, int n) { \
        gemm_body<T>(W, rb, rows, X, cols, Y, ldy, n);                                                                   \
    }                                                                                                                     \
    extern "C" __global__ void embed_##name(const u8* table, long long rb, const int* step, float* X, int d, float scale, const float* replace, int replace_id, const int* pick) { \
        embed_body<T>(table, rb, step, X, d, scale, replace, replace_id, pick);                                                                \
    }

INSTANTIATE(T_F32, f32)
INSTANTIATE(T_F16, f16)
INSTANTIATE(T_BF16, bf16)
INSTANTIATE(T_Q4_0, q4_0)
INSTANTIATE(T_Q4_1, q4_1)
INSTANTIATE(T_Q5_0, q5_0)
INSTANTIATE(T_Q5_1, q5_1)
INSTANTIATE(T_Q8_0, q8_0)
INSTANTIATE(T_Q8_0R, q8_0r)
INSTANTIATE(T_Q4_K, q4_k)
INSTANTIATE(T_Q5_K, q5_k)
INSTANTIATE(T_Q6_K, q6_k)

// ---------------------------------------------------------------------------------------------
// Elementwise and normalisation kernels.

// RMSNorm of `chunks` chunks of `len` floats, one block per chunk: dst = src / rms · w.
extern "C" __global__ void rms_norm(const float* src, float* dst, const float* w, int len, float eps, int chunks) {
    PDL_ENTRY();
    __shared__ float red[32];
    const int c = blockIdx.x;
    const float* x = src + (size_t)c * len;
    float* y = dst + (size_t)c * len;
    float ss = 0.f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) ss += x[j] * x[j];
    ss = block_sum(ss, red);
    const float s = rsqrtf(ss / (float)len + eps);
    for (int j = threadIdx.x; j < len; j += blockDim.x) y[j] = x[j] * s * w[j];
}

// The residual step between blocks, one block per token: X += post ? RMSNorm(P, post) : P, then
// (when `next` is given) Xn = RMSNorm(X, next). d ≤ RN_MAX · blockDim.x.
extern "C" __global__ void __launch_bounds__(256) residual_norm(float* X, const float* P, float* Xn, const float* post, const float* next, int d, float eps) {
    PDL_ENTRY();
    const int t = blockIdx.x;
    residual_body(X + (size_t)t * d, X + (size_t)t * d, P + (size_t)t * d, post, next, d, eps, Xn + (size_t)t * d, nullptr);
}

// After the Q/K/V products, one block per (head, token), head_dim threads: the per-head RMSNorm
// of Q and K (when given), RoPE of both (style 0: adjacent pairs, 1: halves), and the store of
// K and V at position pos0 + t (slot pos % capacity, f16 or f32). Blocks 0..n_head-1 take the
// query heads, the others the KV heads.
extern "C" __global__ void qk_rope_store(float* Q, const float* K, const float* V, const float* qn, const float* kn, float eps, const float* cosv, const float* sinv,
                                         int rot_dim, int style, int n_head, int n_kv, int hd, void* kc, void* vc, int capacity, int f16, const int* step,
                                         const int* rows, const SegKv* kvt) {
    PDL_ENTRY();
    __shared__ float red[32];
    __shared__ float h[256];
    const int head = blockIdx.x, t = blockIdx.y, i = threadIdx.x;
    const bool is_q = head < n_head;
    const int kvh = head - n_head;
    const float* src = is_q ? Q + ((size_t)t * n_head + head) * hd : K + ((size_t)t * n_kv + kvh) * hd;
    const float* w = is_q ? qn : kn;
    float v = src[i];
    if (w) {
        const float ss = block_sum(v * v, red);
        v = v * rsqrtf(ss / (float)hd + eps) * w[i];
    }
    h[i] = v;
    __syncthreads();
    int pos = step[0] + t;
    if (rows) {
        const SegKv& e = kvt[rows[2 * t + 1]];
        pos = rows[2 * t];
        kc = e.k;
        vc = e.v;
        capacity = e.capacity;
    }
    const int half = rot_dim / 2;
    float out = v;
    if (i < rot_dim) {
        int pair, k;
        bool first;
        if (style) { first = i < half; k = first ? i : i - half; pair = first ? i + half : i - half; }
        else { first = (i & 1) == 0; k = i >> 1; pair = first ? i + 1 : i - 1; }
        const float c = cosv[(size_t)pos * half + k], sn = sinv[(size_t)pos * half + k];
        const float o = h[pair];
        out = first ? v * c - o * sn : o * sn + v * c;
    }
    if (is_q) {
        Q[((size_t)t * n_head + head) * hd + i] = out;
    } else {
        const size_t slot = (size_t)(pos % capacity);
        const size_t at = slot * n_kv * hd + (size_t)kvh * hd + i;
        const float vv = V[((size_t)t * n_kv + kvh) * hd + i];
        if (f16) {
            ((__half*)kc)[at] = __float2half_rn(out);
            ((__half*)vc)[at] = __float2half_rn(vv);
        } else {
            ((float*)kc)[at] = out;
            ((float*)vc)[at] = vv;
        }
    }
}

// The LM head's input: Xn[i] = RMSNorm(X[rows[i]]) for the step's `m` head rows.
extern "C" __global__ void norm_rows(const float* X, float* Xn, const float* w, int d, float eps, const int* step, int max_batch) {
    PDL_ENTRY();
    const int i = blockIdx.x;
    const int r = step[4 + max_batch + i];
    const float* x = X + (size_t)r * d;
    float* y = Xn + (size_t)i * d;
    __shared__ float part[32];
    float ss = 0.f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) ss += x[j] * x[j];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    const float s = rsqrtf(part[0] / (float)d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) y[j] = x[j] * s * w[j];
}

extern "C" __global__ void add_inplace(float* dst, const float* src, int count) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) dst[i] += src[i];
}

extern "C" __global__ void add_bias(float* dst, const float* bias, int width, int count) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) dst[i] += bias[i % width];
}

// Up to three biases in one launch: d_k[t * w_k + i] += b_k[i] for the n rows (w_k = 0: none).
extern "C" __global__ void add_bias3(float* d0, const float* b0, int w0, float* d1, const float* b1, int w1, float* d2, const float* b2, int w2, int n) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w0 * n) { d0[i] += b0[i % w0]; return; }
    i -= w0 * n;
    if (i < w1 * n) { d1[i] += b1[i % w1]; return; }
    i -= w1 * n;
    if (i < w2 * n) d2[i] += b2[i % w2];
}

// gate = act(gate) · up; act 0: GELU (tanh approximation), 1: SiLU.
extern "C" __global__ void gated(float* gate, const float* up, int count, int act) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float g = gate[i], a;
    if (act == 0) {
        const float c = 0.7978845608028654f;
        a = 0.5f * g * (1.f + tanhf(c * (g + 0.044715f * g * g * g)));
    } else {
        a = g / (1.f + __expf(-g));
    }
    gate[i] = a * up[i];
}

extern "C" __global__ void softcap(float* v, int count, float cap) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) v[i] = tanhf(v[i] / cap) * cap;
}

// RoPE of every head of the n rows of `buf` (row t at position pos0 + t); style 0: adjacent
// pairs, 1: halves (NeoX). cos/sin: [pos][rot_dim / 2].
extern "C" __global__ void rope(float* buf, const float* cosv, const float* sinv, int width, int head_dim, int rot_dim, int style, const int* step) {
    PDL_ENTRY();
    const int t = blockIdx.x;
    const int pos = step[0] + t;
    const int half = rot_dim / 2;
    const int heads = width / head_dim;
    const float* c = cosv + (size_t)pos * half;
    const float* s = sinv + (size_t)pos * half;
    for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        float* x = buf + (size_t)t * width + h * head_dim;
        const int ia = style ? i : 2 * i, ib = style ? i + half : 2 * i + 1;
        const float a = x[ia], b = x[ib];
        x[ia] = a * c[i] - b * s[i];
        x[ib] = a * s[i] + b * c[i];
    }
}

// Stores the n rows of K and V at positions pos0.. (slot pos % capacity), as f16 or f32.
extern "C" __global__ void store_kv(const float* K, const float* V, void* kc, void* vc, int kv_dim, int capacity, int f16, const int* step) {
    PDL_ENTRY();
    const int t = blockIdx.x;
    const size_t slot = (size_t)((step[0] + t) % capacity);
    for (int j = threadIdx.x; j < kv_dim; j += blockDim.x) {
        const float k = K[(size_t)t * kv_dim + j], v = V[(size_t)t * kv_dim + j];
        if (f16) {
            ((__half*)kc)[slot * kv_dim + j] = __float2half_rn(k);
            ((__half*)vc)[slot * kv_dim + j] = __float2half_rn(v);
        } else {
            ((float*)kc)[slot * kv_dim + j] = k;
            ((float*)vc)[slot * kv_dim + j] = v;
        }
    }
}

// Low-rank adapter, first factor: tmp[t * rank + i] = A[i, :] · X[t, :] (A f16, rank × d_in); one
// warp per (t, i).
extern "C" __global__ void low_rank_a(const __half* A, const float* X, float* tmp, int rank, int d_in, int n) {
    PDL_ENTRY();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int k = blockIdx.x * (blockDim.x >> 5) + warp;
    if (k >= rank * n) return;
    const int t = k / rank, i = k % rank;
    const __half* a = A + (size_t)i * d_in;
    const float* x = X + (size_t)t * d_in;
    float s = 0.f;
    for (int j = lane; j < d_in; j += 32) s += __half2float(a[j]) * x[j];
    s = warp_sum(s);
    if (lane == 0) tmp[k] = s;
}

// Second factor: Y[t, j] += scale · Σ_i Bt[i, j] · tmp[t, i] (Bt f16, rank × d_out).
extern "C" __global__ void low_rank_b(const __half* Bt, const float* tmp, float* Y, int rank, int d_out, float scale, int n) {
    PDL_ENTRY();
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= d_out * n) return;
    const int t = idx / d_out, j = idx % d_out;
    float s = 0.f;
    for (int i = 0; i < rank; i++) s += __half2float(Bt[(size_t)i * d_out + j]) * tmp[t * rank + i];
    Y[idx] += scale * s;
}

// ---------------------------------------------------------------------------------------------
// Attention over the KV cache. Grid (splits, n_kv_head, n): a block takes one query token, one
// KV head (with the G query heads sharing it) and one slice of the visible positions; its 8
// warps walk the slice with an online softmax, then combine. `splits` is an upper bound: a span
// is cut into at most that many slices of at least ATT_MIN_CHUNK positions (decided on the
// device from the step's position, so a captured decode step stays valid as the span grows).
// With more than one slice, every block writes its partial result and the last block of a
// (token, KV head) to finish combines them, so one launch serves decode (many slices over a long
// span, more than 100 multiprocessors busy) and prefill (many tokens, a few slices each).
// `min_chunk`: the fewest positions a slice takes (ATT_MIN_CHUNK unless the host says).
// mask 0: causal, 1: bidirectional, 2: block-causal (`block` positions); window 0: none.

#define ATT_WARPS 8
#define ATT_MAX_G 8
#define ATT_MAX_D 8
#define ATT_MIN_CHUNK 32

// Row `p`'s key and value elements lane*D.. of KV head g (zeros past D).
__device__ __forceinline__ void att_load(const void* kc, const void* vc, int kv_f16, size_t off, int D, float* k, float* v) {
    if (kv_f16 && D == 8) {
        // 16 bytes each: off is a multiple of 8 halves and the cache rows are 16-byte aligned.
        const uint4 kk = *(const uint4*)((const __half*)kc + off), vv = *(const uint4*)((const __half*)vc + off);
        const __half* kh = (const __half*)&kk;
        const __half* vh = (const __half*)&vv;
#pragma unroll
        for (int i = 0; i < 8; i++) { k[i] = __half2float(kh[i]); v[i] = __half2float(vh[i]); }
        return;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_D; i++) {
        if (i < D) {
            k[i] = kv_f16 ? __half2float(((const __half*)kc)[off + i]) : ((const float*)kc)[off + i];
            v[i] = kv_f16 ? __half2float(((const __half*)vc)[off + i]) : ((const float*)vc)[off + i];
        } else {
            k[i] = 0.f;
            v[i] = 0.f;
        }
    }
}

// A decode step's QK-norm, RoPE and KV store folded into its attention (one token): the raw
// Q, K and V of the products, the norm weights (null: none), the RoPE table and style as in
// `qk_rope_store`. `on` = 0: Q is ready and the new row is in the cache already.
struct AttFuse {
    const float* k;
    const float* v;
    const float* qn;
    const float* kn;
    const float* cosv;
    const float* sinv;
    float eps;
    int rot_dim;
    int style;
    int on;
};

// Elements lane*D.. of one head (D ≤ ATT_MAX_D) through `qk_rope_store`'s per-head RMSNorm
// (when w) and RoPE at position pos; every lane of the warp calls it. For style 1 the pair of
// element i lies half/D lanes away (half a multiple of D, checked by the host).
__device__ __forceinline__ void att_qk_prep(float* x, const float* w, int D, int hd, int lane, int pos, const AttFuse& f) {
    if (w) {
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < ATT_MAX_D; k++) ss += k < D ? x[k] * x[k] : 0.f;
        ss = warp_sum(ss);
        const float r = rsqrtf(ss / (float)hd + f.eps);
#pragma unroll
        for (int k = 0; k < ATT_MAX_D; k++)
            if (k < D) x[k] = x[k] * r * w[lane * D + k];
    }
    const int half = f.rot_dim / 2;
    float o[ATT_MAX_D];
    if (f.style) {
        const int dl = half / D;
        const int src = lane * D < half ? lane + dl : lane - dl;
#pragma unroll
        for (int k = 0; k < ATT_MAX_D; k++) o[k] = __shfl_sync(0xffffffff, x[k], src & 31);
    } else {
#pragma unroll
        for (int k = 0; k < ATT_MAX_D; k++) o[k] = x[k ^ 1];
    }
#pragma unroll
    for (int k = 0; k < ATT_MAX_D; k++) {
        const int i = lane * D + k;
        if (k < D && i < f.rot_dim) {
            const bool first = f.style ? i < half : (i & 1) == 0;
            const int kk = f.style ? (first ? i : i - half) : i >> 1;
            const float c = f.cosv[(size_t)pos * half + kk], sn = f.sinv[(size_t)pos * half + kk];
            x[k] = first ? x[k] * c - o[k] * sn : o[k] * sn + x[k] * c;
        }
    }
}

// The new row of a fused decode step: K and V from the products, K normed and rotated, both
// stored in the cache at `off` (rounded to f16 for an f16 cache) and returned as stored.
__device__ __forceinline__ void att_new_row(const AttFuse& f, const void* kc, const void* vc, int kv_f16, size_t off, int src, int D, int hd, int lane, int pos, float* k, float* v) {
#pragma unroll
    for (int i = 0; i < ATT_MAX_D; i++) {
        k[i] = i < D ? f.k[src + lane * D + i] : 0.f;
        v[i] = i < D ? f.v[src + lane * D + i] : 0.f;
    }
    att_qk_prep(k, f.kn, D, hd, lane, pos, f);
#pragma unroll
    for (int i = 0; i < ATT_MAX_D; i++) {
        if (i < D) {
            if (kv_f16) {
                const __half kh = __float2half_rn(k[i]), vh = __float2half_rn(v[i]);
                ((__half*)kc)[off + i] = kh;
                ((__half*)vc)[off + i] = vh;
                k[i] = __half2float(kh);
                v[i] = __half2float(vh);
            } else {
                ((float*)kc)[off + i] = k[i];
                ((float*)vc)[off + i] = v[i];
            }
        }
    }
}

// One key/value row into the online softmax of the G (≤ MG) heads.
template <int MG>
__device__ __forceinline__ void att_step(int G, float (*q)[ATT_MAX_D], const float* k, const float* v, float (*acc)[ATT_MAX_D], float* m, float* l) {
#pragma unroll
    for (int h = 0; h < MG; h++) {
        if (h >= G) break;
        float sc = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_D; i++) sc += q[h][i] * k[i];
        sc = warp_sum(sc);
        const float mn = fmaxf(m[h], sc);
        const float c = __expf(m[h] - mn), e = __expf(sc - mn);
        l[h] = l[h] * c + e;
#pragma unroll
        for (int i = 0; i < ATT_MAX_D; i++) acc[h][i] = acc[h][i] * c + e * v[i];
        m[h] = mn;
    }
}

// MG: the most query heads per KV head the instance serves (its registers hold MG heads; the
// head loops run to MG with compile-time indices, so nothing spills to local memory). FUSE:
// whether the instance can take a folded QK-norm/RoPE/KV store (`fu`); without it the kernel
// needs fewer registers and two blocks fit on a multiprocessor.
template <int MG, bool FUSE>
__device__ __forceinline__ void attention_body(const float* Q, float* O, const void* kc, const void* vc, int kv_f16, int capacity, int n_head, int n_kv, int hd, float scale,
                                               int mask, int block, int window, const int* step, int n, float* part, unsigned int* counters, int splits, int min_chunk, const AttFuse& fu,
                                               const int* rows, const SegKv* kvt) {
    PDL_ENTRY();
    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = n_head / n_kv, D = hd / 32;
    int pos = step[0] + t, stored = step[0] + n;
    if (rows) {
        // A multi-sequence pass (causal only): the row's own position and cache.
        const SegKv& e = kvt[rows[2 * t + 1]];
        pos = rows[2 * t];
        stored = pos + 1;
        kc = e.k;
        vc = e.v;
        capacity = e.capacity;
    }
    int end = mask == 0 ? pos + 1 : (mask == 1 ? stored : min(stored, (pos / block + 1) * block));
    end = max(end, pos + 1);
    const int lo = window > 0 ? max(0, pos + 1 - window) : 0;
    const int cnt = end - lo;
    // Splits in use for this span: at least ATT_MIN_CHUNK positions each (a short span in
    // fewer blocks, combined with less work); the others have nothing to do.
    const int eff = min(splits, max(1, (cnt + min_chunk - 1) / min_chunk));
    if (s >= eff) return;
    const int chunk = (cnt + eff - 1) / eff;
    const int a = lo + s * chunk, b = min(end, a + chunk);
    const int kv_dim = n_kv * hd;

    float q[MG][ATT_MAX_D], acc[MG][ATT_MAX_D], m[MG], l[MG];
#pragma unroll
    for (int h = 0; h < MG; h++) {
        m[h] = -1e30f;
        l[h] = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_D; i++) {
            acc[h][i] = 0.f;
            q[h][i] = (h < G && i < D) ? Q[(size_t)t * n_head * hd + (g * G + h) * hd + lane * D + i] : 0.f;
        }
        if (FUSE && fu.on && h < G) att_qk_prep(q[h], fu.qn, D, hd, lane, pos, fu);
#pragma unroll
        for (int i = 0; i < ATT_MAX_D; i++) q[h][i] *= scale;
    }
    // Two rows per step, both loaded before either is used (the loads overlap).
    for (int p = a + warp; p < b; p += 2 * ATT_WARPS) {
        const int p2 = p + ATT_WARPS;
        float k[ATT_MAX_D], v[ATT_MAX_D], k2[ATT_MAX_D], v2[ATT_MAX_D];
        const size_t off = (size_t)(p % capacity) * kv_dim + g * hd + lane * D, off2 = (size_t)(p2 % capacity) * kv_dim + g * hd + lane * D;
        const int src = (t * n_kv + g) * hd;
        if (FUSE && fu.on && p == pos) att_new_row(fu, kc, vc, kv_f16, off, src, D, hd, lane, pos, k, v);
        else att_load(kc, vc, kv_f16, off, D, k, v);
        if (p2 < b) {
            if (FUSE && fu.on && p2 == pos) att_new_row(fu, kc, vc, kv_f16, off2, src, D, hd, lane, pos, k2, v2);
            else att_load(kc, vc, kv_f16, off2, D, k2, v2);
        }
        att_step<MG>(G, q, k, v, acc, m, l);
        if (p2 < b) att_step<MG>(G, q, k2, v2, acc, m, l);
    }
    // Combine the warps through shared memory: all heads at once where they fit (MG ≤ 4: one
    // barrier), else one head at a time.
    __shared__ bool last;
    const int key = t * n_kv + g;
    // Thread's output element d of head h: the warps' partial sums combined.
    auto emit = [&](int h, int d, float M, float L, float A) {
        if (eff == 1) {
            O[(size_t)t * n_head * hd + (g * G + h) * hd + d] = A / L;
        } else {
            float* pp = part + ((size_t)(key * splits + s) * G + h) * (hd + 2);
            pp[2 + d] = A;
            if (d == 0) { pp[0] = M; pp[1] = L; }
        }
    };
    if constexpr (MG <= 4) {
        __shared__ float sm[ATT_WARPS][MG][2 + 256];
#pragma unroll
        for (int h = 0; h < MG; h++) {
            if (h >= G) break;
            if (lane == 0) { sm[warp][h][0] = m[h]; sm[warp][h][1] = l[h]; }
#pragma unroll
            for (int i = 0; i < ATT_MAX_D; i++)
                if (i < D) sm[warp][h][2 + lane * D + i] = acc[h][i];
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
            const int h = idx / hd, d = idx - h * hd;
            float M = -1e30f;
            for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w][h][0]);
            float L = 0.f, A = 0.f;
            for (int w = 0; w < ATT_WARPS; w++) {
                const float e = __expf(sm[w][h][0] - M);
                L += sm[w][h][1] * e;
                A += sm[w][h][2 + d] * e;
            }
            emit(h, d, M, L, A);
        }
    } else {
        __shared__ float sm[ATT_WARPS][2 + 256];
#pragma unroll
        for (int h = 0; h < MG; h++) {
            if (h >= G) break;
            if (lane == 0) { sm[warp][0] = m[h]; sm[warp][1] = l[h]; }
#pragma unroll
            for (int i = 0; i < ATT_MAX_D; i++)
                if (i < D) sm[warp][2 + lane * D + i] = acc[h][i];
            __syncthreads();
            float M = -1e30f;
            for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w][0]);
            float L = 0.f;
            for (int w = 0; w < ATT_WARPS; w++) L += sm[w][1] * __expf(sm[w][0] - M);
            for (int d = threadIdx.x; d < hd; d += blockDim.x) {
                float A = 0.f;
                for (int w = 0; w < ATT_WARPS; w++) A += sm[w][2 + d] * __expf(sm[w][0] - M);
                emit(h, d, M, L, A);
            }
            __syncthreads();
        }
    }
    if (eff == 1) return;
    // Every thread's partial sums visible device-wide before the block counts itself done.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int done = atomicAdd(&counters[key], 1u);
        last = done == (unsigned int)(eff - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The last block of this (token, KV head): combine the splits, all loads independent;
    // warp h weighs head h's splits (G ≤ ATT_WARPS), then every (head, element) at once.
    __shared__ float wgt[ATT_MAX_G][32];
    __shared__ float tot[ATT_MAX_G];
    const size_t stride = (size_t)G * (hd + 2);
    const float* base0 = part + (size_t)key * splits * G * (hd + 2);
    if (warp < G) {
        const float* base = base0 + (size_t)warp * (hd + 2);
        const float mi = lane < eff ? __ldcg(base + lane * stride) : -1e30f;
        const float li = lane < eff ? __ldcg(base + lane * stride + 1) : 0.f;
        const float M = warp_max(mi);
        const float e = lane < eff ? __expf(mi - M) : 0.f;
        const float L = warp_sum(li * e);
        wgt[warp][lane] = e;
        if (lane == 0) tot[warp] = L;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x) {
        const int h = idx / hd, d = idx - h * hd;
        const float* base = base0 + (size_t)h * (hd + 2);
        float A = 0.f;
        for (int i = 0; i < eff; i++) A += __ldcg(base + i * stride + 2 + d) * wgt[h][i];
        O[(size_t)t * n_head * hd + (g * G + h) * hd + d] = A / tot[h];
    }
    if (threadIdx.x == 0) counters[key] = 0;
}

#define ATT_ARGS                                                                                                                                                     \
    const float *Q, float *O, const void *kc, const void *vc, int kv_f16, int capacity, int n_head, int n_kv, int hd, float scale, int mask, int block, int window, \
        const int *step, int n, float *part, unsigned int *counters, int splits, int min_chunk, AttFuse fu, const int *rows, const SegKv *kvt
extern "C" __global__ void __launch_bounds__(256) attention(ATT_ARGS) {
    attention_body<ATT_MAX_G, true>(Q, O, kc, vc, kv_f16, capacity, n_head, n_kv, hd, scale, mask, block, window, step, n, part, counters, splits, min_chunk, fu, rows, kvt);
}
extern "C" __global__ void __launch_bounds__(256) attention_g4(ATT_ARGS) {
    attention_body<4, true>(Q, O, kc, vc, kv_f16, capacity, n_head, n_kv, hd, scale, mask, block, window, step, n, part, counters, splits, min_chunk, fu, rows, kvt);
}
extern "C" __global__ void __launch_bounds__(256) attention_g8n(ATT_ARGS) {
    attention_body<ATT_MAX_G, false>(Q, O, kc, vc, kv_f16, capacity, n_head, n_kv, hd, scale, mask, block, window, step, n, part, counters, splits, min_chunk, fu, rows, kvt);
}
extern "C" __global__ void __launch_bounds__(256, 2) attention_g4n(ATT_ARGS) {
    attention_body<4, false>(Q, O, kc, vc, kv_f16, capacity, n_head, n_kv, hd, scale, mask, block, window, step, n, part, counters, splits, min_chunk, fu, rows, kvt);
}

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

// The reference mode's kernels (RUVLLM_CUDA_EXACT=1).
#include "reference.cu"
