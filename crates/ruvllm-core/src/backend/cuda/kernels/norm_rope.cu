// Embedding, elementwise steps, norms, QK-norm/RoPE/KV store, biases, LoRA factors. Part of kernels.cu (included there, one translation unit).

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
