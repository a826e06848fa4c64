// One- to eight-token products over f32 activations (`mmv*`, `mmvg*`, the one-token `mmv1s`/`mmvg1s`) and the activation rounding of the tiled products. Part of kernels.cu (included there, one translation unit).

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
