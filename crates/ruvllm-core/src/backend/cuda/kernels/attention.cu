// Attention over the KV cache (decode and prefill, one or several sequences). Part of kernels.cu (included there, one translation unit).

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

// Key/value rows `k, v` and (when `two`, warp-uniform) `k2, v2` into the online softmax of the
// G (≤ MG) heads. Every head's score of both rows is summed across the warp first, the shuffle
// chains interleaved so their latencies overlap (a chain per head and row, one after another,
// made decode attention latency-bound), then the heads take the rows in order: the same sums
// in the same order as one row and one head at a time.
template <int MG>
__device__ __forceinline__ void att_step2(int G, bool two, float (*q)[ATT_MAX_D], const float* k, const float* v, const float* k2, const float* v2, float (*acc)[ATT_MAX_D],
                                          float* m, float* l) {
    float s1[MG], s2[MG];
#pragma unroll
    for (int h = 0; h < MG; h++) {
        s1[h] = 0.f;
        s2[h] = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_D; i++) s1[h] += q[h][i] * k[i];
        if (two) {
#pragma unroll
            for (int i = 0; i < ATT_MAX_D; i++) s2[h] += q[h][i] * k2[i];
        }
    }
    if (two) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int h = 0; h < MG; h++) {
                s1[h] += __shfl_xor_sync(0xffffffff, s1[h], o);
                s2[h] += __shfl_xor_sync(0xffffffff, s2[h], o);
            }
        }
    } else {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int h = 0; h < MG; h++) s1[h] += __shfl_xor_sync(0xffffffff, s1[h], o);
        }
    }
    auto take = [&](int h, float sc, const float* vv) {
        const float mn = fmaxf(m[h], sc);
        const float c = __expf(m[h] - mn), e = __expf(sc - mn);
        l[h] = l[h] * c + e;
#pragma unroll
        for (int i = 0; i < ATT_MAX_D; i++) acc[h][i] = acc[h][i] * c + e * vv[i];
        m[h] = mn;
    };
#pragma unroll
    for (int h = 0; h < MG; h++) {
        if (h < G) {
            take(h, s1[h], v);
            if (two) take(h, s2[h], v2);
        }
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
        att_step2<MG>(G, p2 < b, q, k, v, k2, v2, acc, m, l);
    }
    // Combine the warps through shared memory: all heads at once where they fit (MG ≤ 4, or
    // head_dim ≤ 128: one barrier), else one head at a time.
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
    // Every head's partial sums in `sm`, one barrier, then every (head, element) combined at
    // once.
    auto combine_all = [&](auto& sm) {
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
    };
    if constexpr (MG <= 4) {
        __shared__ float sm[ATT_WARPS][MG][2 + 256];
        combine_all(sm);
    } else if (hd <= 128) {
        __shared__ float sm[ATT_WARPS][MG][2 + 128];
        combine_all(sm);
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
