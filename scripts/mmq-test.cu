// Kernel-level check and timing of the many-token products in kernels.cu, at Gemma 3 270M's
// prefill shapes (512 tokens): the FP32 tiles (`gemm_*` after `act_q8_0`/`act_q8_k`), the WMMA
// int8 version (`gemm_mma_*` after `act_q8_0_i8`), the MMQ kernels (`mmq{32,64}_*` after
// `act_mq_*`) and, up to 16 tokens, the decode-batch kernels (`mmvq{4,8,16}_*`, same input). Weights are random bytes in the GGUF block layouts (Q8_0 repacked as uploaded);
// the reference is a float64 product on the CPU of the dequantized weights (ggml's formulas)
// and the activations as the FP32 path rounds them. Needs no model and no Rust:
//   scripts/mmq-test.sh   (builds with nvcc; run the binary on the GPU machine:
//   `mmq-test [N_TOKENS [quick]]`, quick: six cases, for ragged token counts;
//   `mmq-test check`: errors only, at 1-17, 31-33, 40, 63-65, 100, 129 and 512 tokens, on the
//   random activations and on Gemma-like ones: a few channels hundreds of times the rest, rows
//   of very different sizes)
#include "cuda-test.h"

#include <string>

// Other instances of the MMQ body, for comparison: without the one-stage-ahead loads, and with
// two warp groups splitting each stage.
template <int T, int BN, bool PIPE, int KS>
__global__ void __launch_bounds__(128 * KS) mmq_var(Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) {
    mmq_body<T, BN, PIPE, KS>(a, Xq, Xd, Xm, cols, n);
}
template <int BN, bool PIPE, int KS>
static void launch_var(int ty, dim3 g, Mmv3 a, const int8_t* Xq, const float* Xd, const float* Xm, int cols, int n) {
    switch (ty) {
        case 0: mmq_var<T_Q8_0R, BN, PIPE, KS><<<g, 128 * KS>>>(a, Xq, Xd, Xm, cols, n); break;
        case 1: mmq_var<T_Q4_0, BN, PIPE, KS><<<g, 128 * KS>>>(a, Xq, Xd, Xm, cols, n); break;
        case 2: mmq_var<T_Q5_0, BN, PIPE, KS><<<g, 128 * KS>>>(a, Xq, Xd, Xm, cols, n); break;
        case 3: mmq_var<T_Q4_K, BN, PIPE, KS><<<g, 128 * KS>>>(a, Xq, Xd, Xm, cols, n); break;
        case 4: mmq_var<T_Q6_K, BN, PIPE, KS><<<g, 128 * KS>>>(a, Xq, Xd, Xm, cols, n); break;
    }
}

static std::mt19937_64 rng(12345);
static float urand(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
static uint8_t ubyte() { return (uint8_t)(rng() & 0xFF); }
static void put_h(uint8_t* p, float v) {
    __half h = __float2half(v);
    memcpy(p, &h, 2);
}
static float get_h(const uint8_t* p) {
    __half h;
    memcpy(&h, p, 2);
    return __half2float(h);
}

enum Ty { Q8_0, Q4_0, Q5_0, Q4_K, Q6_K };
static const char* ty_name[] = {"q8_0r", "q4_0", "q5_0", "q4_k", "q6_k"};
static int blk_elems(Ty t) { return t == Q4_K || t == Q6_K ? 256 : 32; }
static int blk_bytes(Ty t) {
    switch (t) {
        case Q8_0: return 34;
        case Q4_0: return 18;
        case Q5_0: return 22;
        case Q4_K: return 144;
        default: return 210;
    }
}

// Random raw blocks and the dequantized row (ggml's dequantize_row_* formulas).
static void make_row(Ty t, int cols, std::vector<uint8_t>& raw, float* y) {
    const int nb = cols / blk_elems(t), bb = blk_bytes(t);
    raw.resize((size_t)nb * bb);
    for (auto& b : raw) b = ubyte();
    for (int b = 0; b < nb; b++) {
        uint8_t* p = raw.data() + (size_t)b * bb;
        if (t == Q8_0) {
            put_h(p, urand(0.0005f, 0.004f));
            const float d = get_h(p);
            for (int j = 0; j < 32; j++) y[b * 32 + j] = d * (float)(int8_t)p[2 + j];
        } else if (t == Q4_0) {
            put_h(p, urand(0.005f, 0.03f));
            const float d = get_h(p);
            for (int j = 0; j < 16; j++) {
                y[b * 32 + j] = d * (float)((p[2 + j] & 0xF) - 8);
                y[b * 32 + j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
        } else if (t == Q5_0) {
            put_h(p, urand(0.003f, 0.02f));
            const float d = get_h(p);
            uint32_t qh;
            memcpy(&qh, p + 2, 4);
            for (int j = 0; j < 16; j++) {
                const int x0 = (p[6 + j] & 0xF) | (((qh >> j) & 1) << 4);
                const int x1 = (p[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                y[b * 32 + j] = d * (float)(x0 - 16);
                y[b * 32 + j + 16] = d * (float)(x1 - 16);
            }
        } else if (t == Q4_K) {
            put_h(p, urand(0.0002f, 0.001f));
            put_h(p + 2, urand(0.0001f, 0.0005f));
            const float d = get_h(p), dmin = get_h(p + 2);
            const uint8_t* sc = p + 4;
            const uint8_t* q = p + 16;
            float* o = y + b * 256;
            for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
                uint8_t s1, m1, s2, m2;
                auto gsm = [&](int k, uint8_t& s, uint8_t& m) {
                    if (k < 4) {
                        s = sc[k] & 63;
                        m = sc[k + 4] & 63;
                    } else {
                        s = (sc[k + 4] & 0xF) | ((sc[k - 4] >> 6) << 4);
                        m = (sc[k + 4] >> 4) | ((sc[k] >> 6) << 4);
                    }
                };
                gsm(is, s1, m1);
                gsm(is + 1, s2, m2);
                for (int l = 0; l < 32; l++) *o++ = d * s1 * (q[l] & 0xF) - dmin * m1;
                for (int l = 0; l < 32; l++) *o++ = d * s2 * (q[l] >> 4) - dmin * m2;
                q += 32;
            }
        } else {
            put_h(p + 208, urand(0.0001f, 0.0008f));
            const float d = get_h(p + 208);
            const uint8_t* ql = p;
            const uint8_t* qh = p + 128;
            const int8_t* sc = (const int8_t*)(p + 192);
            float* o = y + b * 256;
            for (int n = 0; n < 256; n += 128) {
                for (int l = 0; l < 32; l++) {
                    const int is = l / 16;
                    const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    o[l] = d * sc[is] * q1;
                    o[l + 32] = d * sc[is + 2] * q2;
                    o[l + 64] = d * sc[is + 4] * q3;
                    o[l + 96] = d * sc[is + 6] * q4;
                }
                o += 128;
                ql += 64;
                qh += 32;
                sc += 8;
            }
        }
    }
}

// As repack_q8_0 in mod.rs.
static std::vector<uint8_t> repack_q8_0(const std::vector<uint8_t>& src, int rows, int cols, size_t& stride) {
    const int blocks = cols / 32, chunks = (cols + 255) / 256;
    stride = ((size_t)chunks * 16 + cols + 15) / 16 * 16;
    std::vector<uint8_t> out((size_t)rows * stride, 0);
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < blocks; b++) {
            const uint8_t* blk = src.data() + ((size_t)r * blocks + b) * 34;
            uint8_t* dst = out.data() + (size_t)r * stride;
            const int c = b / 8, k = b % 8, base = c * 272;
            memcpy(dst + base + 2 * k, blk, 2);
            memcpy(dst + base + 16 + k * 32, blk + 2, 32);
        }
    return out;
}

struct Weight {
    Ty ty;
    int rows, cols;
    size_t rb;
    uint8_t* dev;
    std::vector<float> deq;  // rows × cols
};

static Weight make_weight(Ty t, int rows, int cols) {
    Weight w{t, rows, cols, 0, nullptr, std::vector<float>((size_t)rows * cols)};
    std::vector<uint8_t> all, raw;
    for (int r = 0; r < rows; r++) {
        make_row(t, cols, raw, w.deq.data() + (size_t)r * cols);
        all.insert(all.end(), raw.begin(), raw.end());
    }
    if (t == Q8_0) {
        all = repack_q8_0(all, rows, cols, w.rb);
    } else {
        w.rb = (size_t)cols / blk_elems(t) * blk_bytes(t);
    }
    CK(cudaMalloc(&w.dev, all.size()));
    CK(cudaMemcpy(w.dev, all.data(), all.size(), cudaMemcpyHostToDevice));
    return w;
}

static int blocks_of(long long count, int per) { return (int)std::max<long long>(1, (count + per - 1) / per); }

// Tokens the check compares: every one up to 128 tokens, else every 7th.
static int tok_step(int n) { return n <= 128 ? 1 : 7; }

// Reference outputs in float64 of weight `w` on `xr` (rounded activations, n × cols), at the
// tokens `tok_step` picks (others left 0).
static std::vector<double> reference(const Weight& w, const std::vector<float>& xr, int n) {
    std::vector<double> ref((size_t)n * w.rows, 0.0);
    for (int t = 0; t < n; t += tok_step(n))
        for (int r = 0; r < w.rows; r++) {
            double s = 0;
            const float* a = w.deq.data() + (size_t)r * w.cols;
            const float* x = xr.data() + (size_t)t * w.cols;
            for (int k = 0; k < w.cols; k++) s += (double)a[k] * x[k];
            ref[(size_t)t * w.rows + r] = s;
        }
    return ref;
}

// The largest over the compared tokens of ‖out − ref‖ / ‖ref‖ (all rows); also counts outputs
// left unwritten (NaN poison) over all tokens.
static double rel_err(const Weight& w, const std::vector<double>& ref, const std::vector<float>& y, int n, int& unwritten) {
    unwritten = 0;
    for (size_t i = 0; i < (size_t)n * w.rows; i++)
        if (!std::isfinite(y[i])) unwritten++;
    double worst = 0;
    for (int t = 0; t < n; t += tok_step(n)) {
        double num = 0, den = 0;
        for (int r = 0; r < w.rows; r++) {
            const double s = ref[(size_t)t * w.rows + r], d = (double)y[(size_t)t * w.rows + r] - s;
            num += d * d;
            den += s * s;
        }
        worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
    }
    return worst;
}

// One pass over the cases at `n` tokens. dist 0: uniform activations with rare 8x ones; 1: as
// Gemma's, a few channels hundreds of times the rest and rows of very different sizes (the
// per-block activation scales matter). timing: also the times (else errors only, one line).
static bool run(int n, bool quick, int dist, bool timing) {
    struct Case {
        Ty ty;
        std::vector<int> rows;  // up to three weights in one launch (MMQ); the others run each
        int cols;
        const char* what;
    };
    std::vector<Case> cases = {
        {Q5_0, {1024}, 640, "attn_q"},         {Q5_0, {256}, 640, "attn_k"},        {Q8_0, {256}, 640, "attn_v (q8_0)"},
        {Q5_0, {2048}, 640, "ffn_gate/up"},    {Q4_K, {640}, 1024, "attn_output"},  {Q4_K, {640}, 2048, "ffn_down (q4_k)"},
        {Q6_K, {640}, 2048, "ffn_down (q6_k)"}, {Q4_0, {1024}, 640, "q4_0 cover"},   {Q5_0, {1024, 256, 256}, 640, "q,k,v one launch"},
        {Q5_0, {2048, 2048}, 640, "gate+up one launch"},
    };
    int max_cols = 2048;
    std::vector<float> x((size_t)n * max_cols);
    for (auto& v : x) v = urand(-1.f, 1.f) * (urand(0.f, 1.f) < 0.01f ? 8.f : 1.f);
    // dist 1, per case: token t's row of `cols` scaled by 0.01-100, channels 3, 77, 300, 513 and
    // 1500 (those below cols) at 50-500x the rest, 77 negative.
    auto gemma_like = [&](int cols) {
        for (int t = 0; t < n; t++) {
            const float rs = powf(10.f, urand(-2.f, 2.f));
            for (int k = 0; k < cols; k++) {
                float v = urand(-1.f, 1.f) * rs;
                if (k == 3 || k == 77 || k == 300 || k == 513 || k == 1500) v = (k == 77 ? -1.f : 1.f) * urand(50.f, 500.f) * rs;
                x[(size_t)t * cols + k] = v;
            }
        }
    };
    float *dX, *dXr, *dY, *dXd, *dXm, *dXd0;
    int8_t *dXq, *dXq0;
    CK(cudaMalloc(&dX, x.size() * 4));
    CK(cudaMemcpy(dX, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dXr, x.size() * 4));
    CK(cudaMalloc(&dXq, x.size()));
    CK(cudaMalloc(&dXq0, x.size()));
    CK(cudaMalloc(&dXd, x.size() / 32 * 4));
    CK(cudaMalloc(&dXd0, x.size() / 32 * 4));
    CK(cudaMalloc(&dXm, x.size() / 32 * 4));
    const size_t ymax = (size_t)n * 4096;
    CK(cudaMalloc(&dY, ymax * 4));
    std::vector<float> y(ymax);
    bool all_ok = true;
    double worst_old = 0, worst_mmq = 0;
    if (timing) printf("%-20s %-6s %-16s %8s %8s %8s %8s %9s %6s %9s | %9s %9s %9s\n", "case", "type", "rows x cols", "act_old", "gemm", "act_mq", "mma", "mmq32/64", "64np", "ks2 32/64",
           "err gemm", "err mma", "err mmq*");
    if (quick) cases = {cases[0], cases[2], cases[4], cases[6], cases[7], cases[8]};
    for (auto& c : cases) {
        const int cols = c.cols;
        if (dist == 1) {
            gemma_like(cols);
            CK(cudaMemcpy(dX, x.data(), (size_t)n * cols * 4, cudaMemcpyHostToDevice));
        }
        const bool k = c.ty == Q4_K || c.ty == Q6_K;
        std::vector<Weight> ws;
        for (int r : c.rows) ws.push_back(make_weight(c.ty, r, cols));
        const int warps = (cols + 255) / 256 * n;
        auto act_old = [&] {
            if (k) act_q8_k<<<blocks_of(warps, 8), 256>>>(dX, dXr, cols, n);
            else act_q8_0<<<blocks_of(warps, 8), 256>>>(dX, dXr, cols, n);
        };
        auto act_mq = [&] {
            if (k) act_mq_q8_k<<<blocks_of(warps, 8), 256>>>(dX, dXq, dXd, dXm, cols, n);
            else act_mq_q8_0<<<blocks_of(warps, 8), 256>>>(dX, dXq, dXd, dXm, cols, n);
        };
        auto act_i8 = [&] { act_q8_0_i8<<<blocks_of(warps, 8), 256>>>(dX, dXq0, dXd0, cols, n); };
        // Outputs: weight i at dY + off[i] (rows_i × n).
        std::vector<size_t> off;
        size_t o = 0;
        for (auto& w : ws) {
            off.push_back(o);
            o += (size_t)w.rows * n;
        }
        auto gemm_old = [&] {
            for (size_t i = 0; i < ws.size(); i++) {
                auto& w = ws[i];
                dim3 g(blocks_of(w.rows, 64), blocks_of(n, 64));
                float* Y = dY + off[i];
                switch (c.ty) {
                    case Q8_0: gemm_q8_0r<<<g, 256>>>(w.dev, w.rb, w.rows, dXr, cols, Y, w.rows, n); break;
                    case Q4_0: gemm_q4_0<<<g, 256>>>(w.dev, w.rb, w.rows, dXr, cols, Y, w.rows, n); break;
                    case Q5_0: gemm_q5_0<<<g, 256>>>(w.dev, w.rb, w.rows, dXr, cols, Y, w.rows, n); break;
                    case Q4_K: gemm_q4_k<<<g, 256>>>(w.dev, w.rb, w.rows, dXr, cols, Y, w.rows, n); break;
                    case Q6_K: gemm_q6_k<<<g, 256>>>(w.dev, w.rb, w.rows, dXr, cols, Y, w.rows, n); break;
                }
            }
        };
        auto gemm_mma = [&] {
            for (size_t i = 0; i < ws.size(); i++) {
                auto& w = ws[i];
                dim3 g(blocks_of(w.rows, 64), blocks_of(n, 64));
                float* Y = dY + off[i];
                switch (c.ty) {
                    case Q8_0: gemm_mma_q8_0r<<<g, 256>>>(w.dev, w.rb, w.rows, dXq0, dXd0, cols, Y, w.rows, n); break;
                    case Q4_0: gemm_mma_q4_0<<<g, 256>>>(w.dev, w.rb, w.rows, dXq0, dXd0, cols, Y, w.rows, n); break;
                    case Q5_0: gemm_mma_q5_0<<<g, 256>>>(w.dev, w.rb, w.rows, dXq0, dXd0, cols, Y, w.rows, n); break;
                    default: break;
                }
            }
        };
        Mmv3 a;
        memset(&a, 0, sizeof a);
        int tiles = 0;
        for (size_t i = 0; i < ws.size(); i++) {
            a.w[i] = ws[i].dev;
            a.rb[i] = (long long)ws[i].rb;
            a.rows[i] = ws[i].rows;
            a.y[i] = dY + off[i];
            tiles += blocks_of(ws[i].rows, 64);
        }
        auto mmq = [&](int bn) {
            // bn: 32 / 64 the kernels as built; 0: 64 without the loads ahead; 1 / 2: 64 / 32
            // with two warp groups.
            dim3 g(tiles, blocks_of(n, bn == 2 || bn == 32 ? 32 : 64));
            if (bn == 0) return launch_var<64, false, 1>(c.ty, g, a, dXq, dXd, dXm, cols, n);
            if (bn == 1) return launch_var<64, true, 2>(c.ty, g, a, dXq, dXd, dXm, cols, n);
            if (bn == 2) return launch_var<32, true, 2>(c.ty, g, a, dXq, dXd, dXm, cols, n);
#define MQ_LAUNCH(name)                                                                    \
    if (bn == 32) mmq32_##name<<<g, 128>>>(a, dXq, dXd, dXm, cols, n); \
    else mmq64_##name<<<g, 128>>>(a, dXq, dXd, dXm, cols, n);
            switch (c.ty) {
                case Q8_0: MQ_LAUNCH(q8_0r) break;
                case Q4_0: MQ_LAUNCH(q4_0) break;
                case Q5_0: MQ_LAUNCH(q5_0) break;
                case Q4_K: MQ_LAUNCH(q4_k) break;
                case Q6_K: MQ_LAUNCH(q6_k) break;
            }
        };
        // The decode-batch kernels (`mmvq{4,8,16}_*`, up to 16 tokens, one warp per row).
        auto mmvq = [&] {
            int total = 0;
            for (auto& w : ws) total += w.rows;
            dim3 g(blocks_of(total, 8));
#define MVQ_LAUNCH(name)                                                    \
    if (n <= 4) mmvq4_##name<<<g, 256>>>(a, dXq, dXd, dXm, cols, n);       \
    else if (n <= 8) mmvq8_##name<<<g, 256>>>(a, dXq, dXd, dXm, cols, n);  \
    else mmvq16_##name<<<g, 256>>>(a, dXq, dXd, dXm, cols, n);
            switch (c.ty) {
                case Q8_0: MVQ_LAUNCH(q8_0r) break;
                case Q4_0: MVQ_LAUNCH(q4_0) break;
                case Q5_0: MVQ_LAUNCH(q5_0) break;
                case Q4_K: MVQ_LAUNCH(q4_k) break;
                case Q6_K: MVQ_LAUNCH(q6_k) break;
            }
        };
        // Rounded activations (the reference's input), and the MMQ quants checked against them.
        act_old();
        act_mq();
        CK(cudaGetLastError());
        std::vector<float> xr((size_t)n * cols), xd((size_t)n * cols / 32), xm((size_t)n * cols / 32);
        std::vector<int8_t> xq((size_t)n * cols);
        CK(cudaMemcpy(xr.data(), dXr, xr.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(xq.data(), dXq, xq.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(xd.data(), dXd, xd.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(xm.data(), dXm, xm.size() * 4, cudaMemcpyDeviceToHost));
        long long act_bad = 0, sum_bad = 0;
        for (size_t i = 0; i < xr.size(); i++)
            if ((float)xq[i] * xd[i / 32] != xr[i]) act_bad++;
        for (size_t b = 0; b < xd.size(); b++) {
            int s = 0;
            for (int j = 0; j < 32; j++) s += xq[b * 32 + j];
            if (fabsf(xd[b] * (float)s - xm[b]) > 1e-6f * fabsf(xm[b]) + 1e-30f) sum_bad++;
        }
        if (act_bad || sum_bad) {
            printf("  act_mq: %lld quants differ from the FP32 path's rounding, %lld block sums wrong\n", act_bad, sum_bad);
            all_ok = false;
        }
        std::vector<std::vector<double>> refs;
        for (auto& w : ws) refs.push_back(reference(w, xr, n));
        auto check = [&](auto run) -> double {
            CK(cudaMemset(dY, 0xFF, ymax * 4));  // NaN poison
            run();
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y.data(), dY, o * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (size_t i = 0; i < ws.size(); i++) {
                int unw;
                std::vector<float> yi(y.begin() + off[i], y.begin() + off[i] + (size_t)ws[i].rows * n);
                const double e = rel_err(ws[i], refs[i], yi, n, unw);
                if (unw) {
                    printf("  %d outputs unwritten\n", unw);
                    return INFINITY;
                }
                worst = std::max(worst, e);
            }
            return worst;
        };
        const bool has_mma = !k;
        act_i8();
        const double e_old = check(gemm_old);
        const double e_mma = has_mma ? check(gemm_mma) : NAN;
        const double e32 = check([&] { mmq(32); });
        const double e64 = check([&] { mmq(64); });
        const double enp = check([&] { mmq(0); }), eks64 = check([&] { mmq(1); }), eks32 = check([&] { mmq(2); });
        const double evq = n <= 16 ? check(mmvq) : 0.0;
        const bool bad = !(evq < 1e-5) || !(e_old < 1e-5) || !(e32 < 1e-5) || !(e64 < 1e-5) || !(enp < 1e-5) || !(eks64 < 1e-5) || !(eks32 < 1e-5) || (has_mma && !(e_mma < 1e-5));
        if (bad) all_ok = false;
        if (!timing) {
            worst_old = std::max(worst_old, e_old);
            worst_mmq = std::max({worst_mmq, e32, e64, enp, eks32, eks64, evq});
            if (bad)
                printf("  n %d dist %d %s: err gemm %.2e mma %.2e mmq32 %.2e mmq64 %.2e 64np %.2e ks2 32 %.2e ks2 64 %.2e mmvq %.2e\n", n, dist, c.what, e_old, e_mma, e32, e64, enp, eks32, eks64, evq);
            for (auto& w : ws) CK(cudaFree(w.dev));
            continue;
        }
        const float t_act = time_us(act_old, 50), t_old = time_us(gemm_old, 50), t_actmq = time_us(act_mq, 50);
        const float t_mma = has_mma ? time_us(gemm_mma, 50) : NAN;
        const float t32 = time_us([&] { mmq(32); }, 50), t64 = time_us([&] { mmq(64); }, 50), tnp = time_us([&] { mmq(0); }, 50);
        const float tks64 = time_us([&] { mmq(1); }, 50), tks32 = time_us([&] { mmq(2); }, 50);
        const float tvq = n <= 16 ? time_us(mmvq, 50) : NAN;
        std::string rs;
        for (int r : c.rows) rs += (rs.empty() ? "" : "+") + std::to_string(r);
        rs += "x" + std::to_string(cols);
        printf("%-20s %-6s %-16s %8.1f %8.1f %8.1f %8.1f %4.1f/%-4.1f %6.1f %4.1f/%-4.1f | %9.2e %9.2e %9.2e\n", c.what, ty_name[c.ty], rs.c_str(), t_act, t_old, t_actmq,
               t_mma, t32, t64, tnp, tks32, tks64, e_old, e_mma, std::max({e32, e64, enp, eks32, eks64, evq}));
        if (n <= 16) printf("%-20s mmvq %.1f us\n", "", tvq);
        for (auto& w : ws) CK(cudaFree(w.dev));
    }
    if (timing)
        printf("(times: microseconds per launch, median of 7 means over 50 launches; 64np: mmq64 without loads ahead; ks2: two warp groups per tile; err: the largest over tokens of ||y - ref|| / ||ref||, ref in float64, mmq*: worst of the MMQ variants)\n");
    else
        printf("  n %3d dist %d: worst err gemm %.2e, MMQ variants %.2e%s\n", n, dist, worst_old, worst_mmq, all_ok ? "" : "  FAIL");
    for (void* p : {(void*)dX, (void*)dXr, (void*)dY, (void*)dXd, (void*)dXm, (void*)dXd0, (void*)dXq, (void*)dXq0}) CK(cudaFree(p));
    return all_ok;
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    bool ok = true;
    if (argc > 1 && !strcmp(argv[1], "check")) {
        // Correctness only, at the token counts short prompts and ragged tiles give, on both
        // activation kinds.
        const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 100, 129, 512};
        for (int dist = 0; dist < 2; dist++)
            for (int n : ns) ok &= run(n, false, dist, false);
    } else {
        const int n = argc > 1 ? atoi(argv[1]) : 512;
        // Fewer cases (correctness at ragged token counts) when a second argument is given.
        printf("n = %d tokens\n", n);
        ok = run(n, argc > 2, 0, true);
    }
    printf("%s\n", ok ? "MMQ TEST: PASS" : "MMQ TEST: FAIL");
    return ok ? 0 : 1;
}
