// Kernel-level check and timing of the one-token LM head over Q8_0 (`head_q8_0r` and
// `head2_q8_0r_*` in kernels.cu) at Gemma 3 270M's shape (262,144 rows × 640, uploaded as
// T_Q8_0R) and a wider one: the logits of every variant must equal `head_q8_0r`'s bit for bit
// and the pick must be the lowest row of the largest logit (rows copied from the best one, below
// and above it, make ties). Needs no model and no Rust: `scripts/head-test.sh` builds it; run
// the binary on the GPU machine: `head-test [rows cols]`.
#include "cuda-test.h"

template <int NC, int RPL, int LD>
__global__ void __launch_bounds__(256) head2_var(HEAD2_ARGS) {
    head2_body<NC, RPL, LD>(HEAD2_CALL);
}

static std::mt19937_64 rng(12345);

struct Dev {
    u8* W;
    long long rb;
    int rows, cols;
    float *X, *nw, *Y, *pv;
    int *out, *step;
    unsigned int* counter;
};

typedef void (*HeadFn)(HEAD2_ARGS);

static void launch(const Dev& d, HeadFn f, int grid) {
    f<<<grid, 256>>>(d.W, d.rb, d.rows, d.X, d.cols, d.Y, 0.f, d.pv, (int*)(d.pv + 8192), d.counter, d.out, d.nw, 1e-6f, d.step, 1);
}

static bool run_case(int rows, int cols, bool timing, int sms) {
    const int chunks = (cols + 255) / 256;
    const long long rb = ((long long)chunks * 16 + cols + 15) / 16 * 16;
    std::vector<u8> w((size_t)rows * rb, 0);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int r = 0; r < rows; r++) {
        u8* row = w.data() + (size_t)r * rb;
        for (int b = 0; b < cols / 32; b++) {
            const int c = b / 8, k = b % 8;
            __half h = __float2half(0.002f + 0.01f * (float)(rng() % 1000) / 1000.f);
            memcpy(row + c * 272 + 2 * k, &h, 2);
            for (int e = 0; e < 32; e++) row[c * 272 + 16 + k * 32 + e] = (u8)(int8_t)std::max(-127, std::min(127, (int)lrintf(nd(rng) * 40.f)));
        }
    }
    std::vector<float> x(2 * cols), nw(cols);
    for (auto& v : x) v = nd(rng) * (rng() % 50 == 0 ? 30.f : 1.f);
    for (auto& v : nw) v = 1.f + 0.3f * nd(rng);
    Dev d;
    d.rb = rb;
    d.rows = rows;
    d.cols = cols;
    CK(cudaMalloc(&d.W, w.size()));
    CK(cudaMalloc(&d.X, x.size() * 4));
    CK(cudaMalloc(&d.nw, cols * 4));
    CK(cudaMalloc(&d.Y, (size_t)rows * 4));
    CK(cudaMalloc(&d.pv, 8192 * 8));
    CK(cudaMalloc(&d.out, 16));
    CK(cudaMalloc(&d.counter, 16));
    CK(cudaMemset(d.counter, 0, 16));
    CK(cudaMalloc(&d.step, 64));
    int st[16] = {0};
    st[4 + 1] = 1;  // the head's row: the second of X
    CK(cudaMemcpy(d.step, st, sizeof st, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.X, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.nw, nw.data(), cols * 4, cudaMemcpyHostToDevice));
    auto upload = [&]() { CK(cudaMemcpy(d.W, w.data(), w.size(), cudaMemcpyHostToDevice)); };
    upload();
    std::vector<float> y0(rows), y1(rows);
    int o0, o1;
    auto get = [&](std::vector<float>& y, int& o) {
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(y.data(), d.Y, (size_t)rows * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&o, d.out, 4, cudaMemcpyDeviceToHost));
    };
    // Ties: copy the best row below and above it.
    launch(d, head_q8_0r, 2048);
    get(y0, o0);
    const int best = o0, lo = best / 2, hi = std::min(rows - 1, best + 1000);
    memcpy(w.data() + (size_t)lo * rb, w.data() + (size_t)best * rb, rb);
    memcpy(w.data() + (size_t)hi * rb, w.data() + (size_t)best * rb, rb);
    upload();
    launch(d, head_q8_0r, 2048);
    get(y0, o0);
    int ref = 0;
    for (int r = 1; r < rows; r++)
        if (y0[r] > y0[ref]) ref = r;
    printf("rows %d cols %d (%lld bytes a row): head_q8_0r picks %d (expected %d, best before ties %d)\n", rows, cols, rb, o0, ref, best);
    bool ok = o0 == ref && ref == lo;
    struct V {
        const char* name;
        HeadFn f;
    };
    std::vector<V> vs;
#define ADD(nc)                                                                                                                      \
    if (chunks == nc) {                                                                                                              \
        vs.push_back({"rpl1 ldcs", head2_var<nc, 1, 0>});                                                                            \
        vs.push_back({"rpl2 ldcs", head2_var<nc, 2, 0>});                                                                            \
        vs.push_back({"rpl4 ldcs", head2_var<nc, 4, 0>});                                                                            \
        vs.push_back({"rpl1 nc256", head2_var<nc, 1, 1>});                                                                           \
        vs.push_back({"rpl2 nc256", head2_var<nc, 2, 1>});                                                                           \
        vs.push_back({"rpl4 nc256", head2_var<nc, 4, 1>});                                                                           \
        vs.push_back({"kernel", head2_q8_0r_##nc});                                                                                  \
    }
    ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7) ADD(8)
    for (auto& v : vs) {
        for (int grid : {sms, 4 * sms, 2048}) {
            CK(cudaMemset(d.Y, 0xff, (size_t)rows * 4));
            launch(d, v.f, grid);
            get(y1, o1);
            const bool same = memcmp(y0.data(), y1.data(), (size_t)rows * 4) == 0 && o1 == o0;
            if (!same) {
                int diff = 0;
                for (int r = 0; r < rows; r++) diff += memcmp(&y0[r], &y1[r], 4) != 0;
                printf("  %-12s grid %5d: DIFFERENT (%d logits differ, pick %d vs %d)\n", v.name, grid, diff, o1, o0);
                ok = false;
            }
        }
    }
    if (timing) {
        const double mb = (double)rows * rb / 1e6;
        for (int grid : {1024, 2048, 4096}) {
            const float t = time_us([&] { launch(d, head_q8_0r, grid); }, 40);
            printf("  head_q8_0r   grid %5d: %7.2f us  %5.2f TB/s\n", grid, t, mb / t);
        }
        for (auto& v : vs) {
            int occ = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, v.f, 256, 0));
            for (int k : {1, 2, 3, 4, 6, 8, 16}) {
                const int grid = k * sms;
                const float t = time_us([&] { launch(d, v.f, grid); }, 40);
                printf("  %-12s grid %5d (%d/SM, occ %d): %7.2f us  %5.2f TB/s\n", v.name, grid, k, occ, t, mb / t);
            }
        }
    }
    CK(cudaFree(d.W));
    CK(cudaFree(d.X));
    CK(cudaFree(d.nw));
    CK(cudaFree(d.Y));
    CK(cudaFree(d.pv));
    CK(cudaFree(d.out));
    CK(cudaFree(d.counter));
    CK(cudaFree(d.step));
    return ok;
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const int sms = prop.multiProcessorCount;
    bool ok = true;
    if (argc >= 3) {
        ok &= run_case(atoi(argv[1]), atoi(argv[2]), true, sms);
    } else {
        ok &= run_case(262144, 640, true, sms);
        ok &= run_case(100003, 1152, false, sms);
        ok &= run_case(5001, 256, false, sms);
        ok &= run_case(777, 2048, false, sms);
    }
    printf(ok ? "ALL SAME\n" : "MISMATCH\n");
    return ok ? 0 : 1;
}
