// Reference mode (`RUVLLM_CUDA_EXACT=1`): the forward pass as the CPU's scalar reference path
// computes it (`RUVLLM_FORCE_SCALAR=1`; the portable kernels give the same bits), operation for
// operation, so the GPU's logits equal the CPU's bit for bit.
//
// - Every float operation is an explicit round-to-nearest intrinsic (__fadd_rn, __fmul_rn, ...),
//   which nvcc never fuses into an FMA, in the order the Rust code writes it; a sum runs in one
//   chain in the CPU's order (the same partial accumulators where the CPU has them).
// - Integer block sums are exact in any order; conversions and comparisons are exact.
// - `e^x` is the CPU's `exp_approx` (Cephes polynomial, plain arithmetic), not the device's expf.
// - One thread per output element with sequential sums: slow by design, a correctness tool.
//
// The Rust code each kernel mirrors is named next to it (crates/ruvllm-core/src/backend/cpu/).
// Included at the end of kernels.cu (PDL_ENTRY, u8, the T_* type ids).

#define RA(a, b) __fadd_rn(a, b)
#define RS(a, b) __fsub_rn(a, b)
#define RM(a, b) __fmul_rn(a, b)
#define RD(a, b) __fdiv_rn(a, b)

// vec.rs `exp_approx` (constants by their f32 bits).
__device__ __forceinline__ float ref_exp(float x) {
    const float lo = __int_as_float(0xc2aeac50), hi = __int_as_float(0x42b17217);
    const bool under = x < lo;
    if (x < lo) x = lo;
    if (x > hi) x = hi;
    const float round = 12582912.0f;
    const float n = RS(RA(RM(x, __int_as_float(0x3fb8aa3b)), round), round);
    const float r = RS(RS(x, RM(n, __int_as_float(0x3f318000))), RM(n, __int_as_float(0xb95e8083)));
    float p = __int_as_float(0x39506967);
    p = RA(RM(p, r), __int_as_float(0x3ab743ce));
    p = RA(RM(p, r), __int_as_float(0x3c088908));
    p = RA(RM(p, r), __int_as_float(0x3d2aa9c1));
    p = RA(RM(p, r), __int_as_float(0x3e2aaaaa));
    p = RA(RM(p, r), 0.5f);
    const float y = RA(RA(RM(RM(p, r), r), r), 1.0f);
    // Rust's `as i32`: NaN gives 0, as cvt.rzi does.
    const int ni = (int)n;
    const int a = ni >> 1, b = ni - a;
    const float pa = __int_as_float((a + 127) << 23), pb = __int_as_float((b + 127) << 23);
    return under ? 0.0f : RM(RM(y, pa), pb);
}

// vec.rs `gelu_tanh_exp`: x / (1 + e^(-2u)).
__device__ __forceinline__ float ref_gelu(float x) {
    const float u = RM(RM(__int_as_float(0xbfcc4229), x), RA(1.0f, RM(RM(__int_as_float(0x3d372713), x), x)));
    return RD(x, RA(1.0f, ref_exp(u)));
}

__device__ __forceinline__ float ref_f16_at(const u8* p) { return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8)))); }

// quant.rs `nearest_int` and `round_f16`.
__device__ __forceinline__ int ref_nearest(float x) { return (int)(__float_as_uint(RA(x, 12582912.0f)) & 0x007fffff) - 0x00400000; }
__device__ __forceinline__ float ref_round_f16(float v) { return __half2float(__float2half_rn(v)); }

// vec.rs `dot_generic` / ops.rs `dot_elem` over half `b`: eight partial sums, summed in order
// from -0.0 (Rust's float `Sum`), then the tail.
__device__ __forceinline__ float ref_dot8h(const float* a, const __half* b, int n) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int chunks = n / 8;
    for (int c = 0; c < chunks; c++)
        for (int j = 0; j < 8; j++) acc[j] = RA(acc[j], RM(a[c * 8 + j], __half2float(b[c * 8 + j])));
    float s = -0.0f;
    for (int j = 0; j < 8; j++) s = RA(s, acc[j]);
    for (int i = chunks * 8; i < n; i++) s = RA(s, RM(a[i], __half2float(b[i])));
    return s;
}

// ops.rs `rms_norm` / `rms_norm_chunks_inplace`: 1 / sqrt(Σv² / len + eps), then v · scale · w.
__device__ __forceinline__ void ref_norm_row(const float* x, float* y, const float* w, int len, float eps) {
    float ss = -0.0f;
    for (int i = 0; i < len; i++) ss = RA(ss, RM(x[i], x[i]));
    ss = RD(ss, (float)len);
    const float scale = RD(1.0f, __fsqrt_rn(RA(ss, eps)));
    for (int i = 0; i < len; i++) y[i] = RM(RM(x[i], scale), w[i]);
}

// RMSNorm of `chunks` chunks of `len` floats (in place when src == dst), one thread per chunk.
extern "C" __global__ void ref_rms_norm(const float* src, float* dst, const float* w, int len, float eps, int chunks) {
    PDL_ENTRY();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < chunks) ref_norm_row(src + (size_t)c * len, dst + (size_t)c * len, w, len, eps);
}

// The LM head's final norm of the step's head rows (as `norm_rows`).
extern "C" __global__ void ref_norm_rows(const float* X, float* Xn, const float* w, int d, float eps, const int* step, int max_batch) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < step[2]) ref_norm_row(X + (size_t)step[4 + max_batch + i] * d, Xn + (size_t)i * d, w, d, eps);
}

// vec.rs `gelu_tanh_mul_generic` / `silu_mul_generic`.
extern "C" __global__ void ref_gated(float* gate, const float* up, int count, int act) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float g = gate[i];
    gate[i] = act ? RM(RD(g, RA(1.0f, ref_exp(-g))), up[i]) : RM(ref_gelu(g), up[i]);
}

// quant.rs `BlockQ8` (d, quants) and `BlockQ8K` (d, quants, sums of 16).
struct RefQ8 {
    float d;
    int8_t qs[32];
};
struct RefQ8K {
    float d;
    int8_t qs[256];
    short bsums[16];
};

// quant.rs `quantize_act_q8`, one thread per 32-block of the n × cols activations.
extern "C" __global__ void ref_act_q8(const float* X, RefQ8* out, int blocks) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= blocks) return;
    const float* x = X + (size_t)i * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = RD(amax, 127.0f);
    const float id = amax != 0.0f ? RD(127.0f, amax) : 0.0f;
    RefQ8* y = out + i;
    for (int j = 0; j < 32; j++) y->qs[j] = (int8_t)ref_nearest(RM(x[j], id));
    y->d = ref_round_f16(d);
}

// quant.rs `quantize_act_q8k`, one thread per 256-block.
extern "C" __global__ void ref_act_q8k(const float* X, RefQ8K* out, int blocks) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= blocks) return;
    const float* x = X + (size_t)i * 256;
    RefQ8K* y = out + i;
    float mx = 0.0f, amax = 0.0f;
    for (int j = 0; j < 256; j++) {
        const float a = fabsf(x[j]);
        if (a > amax) {
            amax = a;
            mx = x[j];
        }
    }
    if (amax == 0.0f) {
        y->d = 0.0f;
        for (int j = 0; j < 256; j++) y->qs[j] = 0;
        for (int j = 0; j < 16; j++) y->bsums[j] = 0;
        return;
    }
    const float iscale = RD(-127.0f, mx);
    for (int j = 0; j < 256; j++) y->qs[j] = (int8_t)min(ref_nearest(RM(iscale, x[j])), 127);
    for (int j = 0; j < 16; j++) {
        short s = 0;
        for (int k = 0; k < 16; k++) s += y->qs[16 * j + k];
        y->bsums[j] = s;
    }
    y->d = RD(1.0f, iscale);
}

// The quant layouts, decoded once for both the dot products and the embedding's dequantize.
// 32-element blocks: block b's f16 scale and the signed quant of its element e.
template <int T>
struct Ref32;
template <>
struct Ref32<T_Q8_0R> {  // as uploaded: per 256 columns, eight f16 scales then 256 quants
    static __device__ __forceinline__ float d(const u8* row, int b) { return ref_f16_at(row + (size_t)(b >> 3) * 272 + 2 * (b & 7)); }
    static __device__ __forceinline__ int q(const u8* row, int b, int e) { return (int8_t)row[(size_t)(b >> 3) * 272 + 16 + (b & 7) * 32 + e]; }
};
template <>
struct Ref32<T_Q4_0> {
    static __device__ __forceinline__ float d(const u8* row, int b) { return ref_f16_at(row + (size_t)b * 18); }
    static __device__ __forceinline__ int q(const u8* row, int b, int e) {
        const u8* qs = row + (size_t)b * 18 + 2;
        return (e < 16 ? (qs[e] & 0x0F) : (qs[e - 16] >> 4)) - 8;
    }
};
template <>
struct Ref32<T_Q5_0> {
    static __device__ __forceinline__ float d(const u8* row, int b) { return ref_f16_at(row + (size_t)b * 22); }
    static __device__ __forceinline__ int q(const u8* row, int b, int e) {
        const u8* blk = row + (size_t)b * 22;
        const uint32_t qh = blk[2] | (blk[3] << 8) | (blk[4] << 16) | ((uint32_t)blk[5] << 24);
        const int lo = e < 16 ? (blk[6 + e] & 0x0F) : (blk[6 + e - 16] >> 4);
        return (lo | (((qh >> e) << 4) & 0x10)) - 16;
    }
};

// quant.rs `get_scale_min_k4`.
__device__ __forceinline__ void ref_scale_min_k4(int j, const u8* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
// Q4_K super-block `blk`: element e's 4-bit quant and its sub-block (the scale/min index).
__device__ __forceinline__ int ref_q4k(const u8* blk, int e, int& sub) {
    const int k = e / 64, hi = (e % 64) >= 32;
    sub = 2 * k + hi;
    const u8 q = blk[16 + 32 * k + e % 32];
    return hi ? q >> 4 : q & 0xF;
}
// Q6_K super-block `blk`: element e's signed quant (quant.rs `q6_k_quants` − 32); its scale is
// the i8 at 192 + e / 16.
__device__ __forceinline__ int ref_q6k(const u8* blk, int e) {
    const int n = e / 128, part = e % 128 / 32, l = e % 32;
    const u8* ql = blk + 64 * n;
    const u8 h = blk[128 + 32 * n + l];
    const int lo = part & 1 ? ql[l + 32] : ql[l];
    return ((part < 2 ? lo & 0xF : lo >> 4) | (((h >> (2 * part)) & 3) << 4)) - 32;
}

// dot.rs's scalar dot products of one weight row with one activation row. The integer block
// sums are exact whatever order the elements come in; the float steps are dot.rs's.
template <int T>
__device__ float ref_dot(const u8* w, const void* act, const float* x, int cols) {
    const RefQ8* a = (const RefQ8*)act;
    float sumf = 0.0f;
    for (int b = 0; b < cols / 32; b++) {
        int sumi = 0;
        for (int e = 0; e < 32; e++) sumi += Ref32<T>::q(w, b, e) * (int)a[b].qs[e];
        sumf = RA(sumf, RM((float)sumi, RM(Ref32<T>::d(w, b), a[b].d)));
    }
    return sumf;
}

template <>
__device__ float ref_dot<T_Q4_K>(const u8* w, const void* act, const float*, int cols) {
    const RefQ8K* a = (const RefQ8K*)act;
    float sumf = 0.0f;
    for (int b = 0; b < cols / 256; b++) {
        const u8* blk = w + (size_t)b * 144;
        const RefQ8K& y = a[b];
        int sc[8], msum = 0;
        for (int j = 0; j < 8; j++) {
            int m;
            ref_scale_min_k4(j, blk + 4, sc[j], m);
            msum += m * ((int)y.bsums[2 * j] + (int)y.bsums[2 * j + 1]);
        }
        int isum = 0;
        for (int e = 0; e < 256; e++) {
            int sub;
            const int q = ref_q4k(blk, e, sub);
            isum += sc[sub] * q * y.qs[e];
        }
        sumf = RA(sumf, RS(RM(RM(ref_f16_at(blk), y.d), (float)isum), RM(RM(ref_f16_at(blk + 2), y.d), (float)msum)));
    }
    return sumf;
}

template <>
__device__ float ref_dot<T_Q6_K>(const u8* w, const void* act, const float*, int cols) {
    const RefQ8K* a = (const RefQ8K*)act;
    float sumf = 0.0f;
    for (int b = 0; b < cols / 256; b++) {
        const u8* blk = w + (size_t)b * 210;
        int isum = 0;
        for (int e = 0; e < 256; e++) isum += (int)(int8_t)blk[192 + e / 16] * ref_q6k(blk, e) * a[b].qs[e];
        sumf = RA(sumf, RM(RM(ref_f16_at(blk + 208), a[b].d), (float)isum));
    }
    return sumf;
}

// dot.rs `dot_f32` / `dot_f16`: eight partial sums, their sum, plus the tail's own sum.
template <int T>
__device__ __forceinline__ float ref_wf(const u8* w, int i) {
    if (T == T_F32) return __int_as_float((int)(w[4 * i] | (w[4 * i + 1] << 8) | (w[4 * i + 2] << 16) | ((unsigned)w[4 * i + 3] << 24)));
    return ref_f16_at(w + 2 * i);
}
template <int T>
__device__ __forceinline__ float ref_dot_float(const u8* w, const float* x, int cols) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int done = cols / 8 * 8;
    for (int c = 0; c < done; c += 8)
        for (int i = 0; i < 8; i++) acc[i] = RA(acc[i], RM(ref_wf<T>(w, c + i), x[c + i]));
    float tail = 0.0f;
    for (int i = done; i < cols; i++) tail = RA(tail, RM(ref_wf<T>(w, i), x[i]));
    float s = -0.0f;
    for (int i = 0; i < 8; i++) s = RA(s, acc[i]);
    return RA(s, tail);
}
template <>
__device__ float ref_dot<T_F32>(const u8* w, const void*, const float* x, int cols) { return ref_dot_float<T_F32>(w, x, cols); }
template <>
__device__ float ref_dot<T_F16>(const u8* w, const void*, const float* x, int cols) { return ref_dot_float<T_F16>(w, x, cols); }

// Y[t · rows + r] = W[r] · x[t]: one thread per (row, token); `act` holds token t's quantized
// activations at t · act_stride bytes (the float formats read X).
template <int T>
__device__ __forceinline__ void ref_mv_body(const u8* W, long long rb, int rows, const u8* act, long long act_stride, const float* X, int cols, float* Y) {
    PDL_ENTRY();
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (r >= rows) return;
    Y[(size_t)t * rows + r] = ref_dot<T>(W + (size_t)r * rb, act + (size_t)t * act_stride, X + (size_t)t * cols, cols);
}
#define REF_MV(T, name)                                                                                                        \
    extern "C" __global__ void ref_mv_##name(const u8* W, long long rb, int rows, const u8* act, long long act_stride, const float* X, int cols, float* Y) { \
        ref_mv_body<T>(W, rb, rows, act, act_stride, X, cols, Y);                                                                 \
    }
REF_MV(T_Q8_0R, q8_0r)
REF_MV(T_Q4_0, q4_0)
REF_MV(T_Q5_0, q5_0)
REF_MV(T_Q4_K, q4_k)
REF_MV(T_Q6_K, q6_k)
REF_MV(T_F32, f32)
REF_MV(T_F16, f16)

// low_rank.rs: H[t · rank + j] = A[j] · x[t] (`dot_elem`), one thread per (t, j).
extern "C" __global__ void ref_lr_a(const __half* A, const float* X, float* H, int rank, int d_in, int n) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rank * n) return;
    const int t = i / rank, j = i % rank;
    H[i] = ref_dot8h(X + (size_t)t * d_in, A + (size_t)j * d_in, d_in);
}

// low_rank.rs: y[t] += (scale · H[t, j]) · Bᵀ[j] for j in order (`axpy_elem`), one thread per (t, o).
extern "C" __global__ void ref_lr_b(const __half* Bt, const float* H, float* Y, int rank, int d_out, float scale, int n) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d_out * n) return;
    const int t = i / d_out, o = i % d_out;
    float y = Y[i];
    for (int j = 0; j < rank; j++) y = RA(y, RM(RM(scale, H[t * rank + j]), __half2float(Bt[(size_t)j * d_out + o])));
    Y[i] = y;
}

// rope.rs `RopeTable::apply` of the n rows of `buf` at positions pos0.., one thread per
// (token, head, pair).
extern "C" __global__ void ref_rope(float* buf, const float* cosv, const float* sinv, int width, int head_dim, int rot_dim, int style, int pos0, int n) {
    PDL_ENTRY();
    const int half = rot_dim / 2, heads = width / head_dim;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (half == 0 || i >= n * heads * half) return;
    const int t = i / (heads * half), h = (i / half) % heads, k = i % half;
    const size_t pos = (size_t)(pos0 + t);
    const float c = cosv[pos * half + k], s = sinv[pos * half + k];
    float* x = buf + (size_t)t * width + (size_t)h * head_dim;
    const int ia = style ? k : 2 * k, ib = style ? k + half : 2 * k + 1;
    const float a = x[ia], b = x[ib];
    x[ia] = RS(RM(a, c), RM(b, s));
    x[ib] = RA(RM(a, s), RM(b, c));
}

// mask.rs `AttentionMask::visible`: the first position and count the query at `pos` sees.
__device__ __forceinline__ void ref_span(int pos, int stored, int mk, int block, int window, int& lo, int& cnt) {
    int end = mk == 0 ? pos + 1 : mk == 1 ? stored : min(stored, (pos / block + 1) * block);
    end = max(end, pos + 1);
    lo = window > 0 ? max(pos + 1 - window, 0) : 0;
    cnt = end - lo;
}

struct RefAtt {
    const float* Q;
    const void* kc;
    const void* vc;
    float* S;
    float* out;
    int f16, capacity, n_head, n_kv, head_dim, mk, block, window, pos0, n, stride;
    float scale;
};

__device__ __forceinline__ float ref_kv(const void* c, int f16, size_t i) { return f16 ? __half2float(((const __half*)c)[i]) : ((const float*)c)[i]; }

// attention.rs `scores`: S[(t · n_head + h) · stride + j] = dot(q, k[lo + j]) · scale, one thread
// per (position, head, token).
extern "C" __global__ void ref_att_scores(RefAtt a) {
    PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, t = blockIdx.z;
    int lo, cnt;
    ref_span(a.pos0 + t, a.pos0 + a.n, a.mk, a.block, a.window, lo, cnt);
    if (j >= cnt) return;
    const int g = h / (a.n_head / a.n_kv), hd = a.head_dim;
    const size_t krow = (size_t)((lo + j) % a.capacity) * a.n_kv * hd + (size_t)g * hd;
    const float* q = a.Q + (size_t)t * a.n_head * hd + (size_t)h * hd;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int chunks = hd / 8;
    for (int c = 0; c < chunks; c++)
        for (int e = 0; e < 8; e++) acc[e] = RA(acc[e], RM(q[c * 8 + e], ref_kv(a.kc, a.f16, krow + c * 8 + e)));
    float s = -0.0f;
    for (int e = 0; e < 8; e++) s = RA(s, acc[e]);
    for (int e = chunks * 8; e < hd; e++) s = RA(s, RM(q[e], ref_kv(a.kc, a.f16, krow + e)));
    a.S[((size_t)t * a.n_head + h) * a.stride + j] = RM(s, a.scale);
}

// vec.rs `softmax_generic` of each score row, one thread per (head, token).
extern "C" __global__ void ref_att_softmax(RefAtt a) {
    PDL_ENTRY();
    const int h = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (h >= a.n_head) return;
    int lo, cnt;
    ref_span(a.pos0 + t, a.pos0 + a.n, a.mk, a.block, a.window, lo, cnt);
    float* row = a.S + ((size_t)t * a.n_head + h) * a.stride;
    float mx = -INFINITY;
    for (int j = 0; j < cnt; j++) mx = fmaxf(mx, row[j]);
    for (int j = 0; j < cnt; j++) row[j] = ref_exp(RS(row[j], mx));
    float sum = 0.0f;
    for (int j = 0; j < cnt; j++) sum = RA(sum, row[j]);
    const float inv = RD(1.0f, sum);
    for (int j = 0; j < cnt; j++) row[j] = RM(row[j], inv);
}

// attention.rs `weighted_sum`: out = Σ_j w[j] · v[lo + j] in order from zero (`axpy`), one thread
// per (element, head, token).
extern "C" __global__ void ref_att_values(RefAtt a) {
    PDL_ENTRY();
    const int e = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, t = blockIdx.z, hd = a.head_dim;
    if (e >= hd) return;
    int lo, cnt;
    ref_span(a.pos0 + t, a.pos0 + a.n, a.mk, a.block, a.window, lo, cnt);
    const int g = h / (a.n_head / a.n_kv);
    const float* row = a.S + ((size_t)t * a.n_head + h) * a.stride;
    float acc = 0.0f;
    for (int j = 0; j < cnt; j++) {
        const size_t vrow = (size_t)((lo + j) % a.capacity) * a.n_kv * hd + (size_t)g * hd;
        acc = RA(acc, RM(row[j], ref_kv(a.vc, a.f16, vrow + e)));
    }
    a.out[(size_t)t * a.n_head * hd + (size_t)h * hd + e] = acc;
}

// quant.rs `dequantize`, element j of a row: the embedding gather.
template <int T>
__device__ float ref_dq(const u8* row, int j) {
    return RM((float)Ref32<T>::q(row, j / 32, j % 32), Ref32<T>::d(row, j / 32));
}
template <>
__device__ float ref_dq<T_Q4_K>(const u8* row, int j) {
    const u8* b = row + (size_t)(j / 256) * 144;
    int sub, sc, m;
    const int q = ref_q4k(b, j % 256, sub);
    ref_scale_min_k4(sub, b + 4, sc, m);
    return RS(RM(RM(ref_f16_at(b), (float)sc), (float)q), RM(ref_f16_at(b + 2), (float)m));
}
template <>
__device__ float ref_dq<T_Q6_K>(const u8* row, int j) {
    const u8* b = row + (size_t)(j / 256) * 210;
    return RM(RM(ref_f16_at(b + 208), (float)(int8_t)b[192 + j % 256 / 16]), (float)ref_q6k(b, j % 256));
}
template <>
__device__ float ref_dq<T_F16>(const u8* row, int j) { return ref_f16_at(row + 2 * j); }
template <>
__device__ float ref_dq<T_F32>(const u8* row, int j) { return ref_wf<T_F32>(row, j); }

// X[t] = scale · table[token t] (a replaced row: scale · replace), one thread per element.
template <int T>
__device__ __forceinline__ void ref_embed_body(const u8* table, long long rb, const int* step, float* X, int d, float scale, const float* replace, int replace_id, const int* pick) {
    PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (j >= d) return;
    const int tok = step_token(step, pick, t);
    const float v = replace && tok == replace_id ? replace[j] : ref_dq<T>(table + (size_t)tok * rb, j);
    X[(size_t)t * d + j] = RM(v, scale);
}
#define REF_EMBED(T, name)                                                                                                                       \
    extern "C" __global__ void ref_embed_##name(const u8* table, long long rb, const int* step, float* X, int d, float scale, const float* replace, int replace_id, const int* pick) { \
        ref_embed_body<T>(table, rb, step, X, d, scale, replace, replace_id, pick);                                                                \
    }
REF_EMBED(T_Q8_0R, q8_0r)
REF_EMBED(T_Q4_0, q4_0)
REF_EMBED(T_Q5_0, q5_0)
REF_EMBED(T_Q4_K, q4_k)
REF_EMBED(T_Q6_K, q6_k)
REF_EMBED(T_F16, f16)
REF_EMBED(T_F32, f32)
