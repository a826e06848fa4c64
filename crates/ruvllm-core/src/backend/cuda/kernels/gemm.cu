// Tiled many-token products: FP32 (`gemm_*`) and WMMA int8 (`gemm_mma_*`). Part of kernels.cu (included there, one translation unit).

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
