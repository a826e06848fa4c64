// The one-token LM heads over Q8_0 with the greedy pick (`head_q8_0r`, `head2_q8_0r_*`). Part of kernels.cu (included there, one translation unit).

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
