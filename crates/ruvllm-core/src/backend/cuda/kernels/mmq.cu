// Int8 products with scales in registers: MMQ (`mmq*`), the decode-batch `mmvq*`, and their activation quantization (`act_mq_*`). Part of kernels.cu (included there, one translation unit).

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
