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

// The kernels, by concern (one translation unit: the parts share the helpers above).
#include "kernels/products.cu"
#include "kernels/head.cu"
#include "kernels/gemm.cu"
#include "kernels/mmq.cu"
#include "kernels/norm_rope.cu"
#include "kernels/attention.cu"
#include "kernels/pick.cu"

// The reference mode's kernels (RUVLLM_CUDA_EXACT=1).
#include "reference.cu"
