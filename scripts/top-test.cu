// Check and timing of the per-row best-logits kernels (`top1`, `top2`: what
// `Backend::top_logits` hands the sampler) against a sort on the CPU, on rows of Gemma 3 270M's
// and Qwen2.5's vocabularies: random logits, rows with many ties (values on a coarse grid), NaN,
// -inf and +inf scattered in, and a row shorter than one list. Needs no model and no Rust:
//   scripts/cuda-test.sh top-test   (then run target/top-test on the GPU machine)
#include "cuda-test.h"

struct Case {
    int vocab, rows;
    float grid;  // 0: continuous values; else values rounded to this step (ties)
    const char* what;
};

int main() {
    const Case cases[] = {{262144, 16, 0.f, "gemma vocab, 16 rows"}, {262144, 3, 0.25f, "gemma vocab, ties"}, {151936, 8, 0.f, "qwen vocab, 8 rows"},
                          {151936, 1, 1.f, "qwen vocab, heavy ties"}, {1000, 4, 0.f, "shorter than a list"}, {2048 * 33 + 5, 2, 0.f, "33 lists and a bit"}};
    bool ok = true;
    std::mt19937 rng(7);
    for (const Case& c : cases) {
        const int v = c.vocab, m = c.rows;
        const int lists = (v + TOP_SLICE - 1) / TOP_SLICE;
        std::vector<float> x((size_t)v * m);
        std::normal_distribution<float> nd(0.f, 3.f);
        for (auto& e : x) e = c.grid > 0 ? std::round(nd(rng) / c.grid) * c.grid : nd(rng);
        for (int r = 0; r < m; r++) {
            float* row = &x[(size_t)r * v];
            row[rng() % v] = NAN;
            row[rng() % v] = -INFINITY;
            if (r == 1) row[rng() % v] = INFINITY;
        }
        float *dx, *buf;
        CK(cudaMalloc(&dx, x.size() * 4));
        const size_t half = (size_t)m * lists * TOPC;
        CK(cudaMalloc(&buf, 4 * half * 4));
        CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        float* sv[2] = {buf, buf + 2 * half};
        int* si[2] = {(int*)(buf + half), (int*)(buf + 3 * half)};
        int k = 0;
        auto run = [&] {
            top1<<<dim3(lists, m), 256>>>(dx, v, sv[0], si[0]);
            int n = lists;
            k = 0;
            while (n > 1) {
                const int g = (n + TOP_SLICE / TOPC - 1) / (TOP_SLICE / TOPC);
                top2<<<dim3(g, m), 256>>>(sv[k], si[k], n, sv[k ^ 1], si[k ^ 1]);
                k ^= 1;
                n = g;
            }
        };
        run();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> gv((size_t)m * TOPC);
        std::vector<int> gi((size_t)m * TOPC);
        CK(cudaMemcpy(gv.data(), sv[k], gv.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gi.data(), si[k], gi.size() * 4, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int r = 0; r < m; r++) {
            std::vector<std::pair<float, int>> ref;
            for (int j = 0; j < v; j++) {
                float e = x[(size_t)r * v + j];
                e = std::isnan(e) ? -INFINITY : std::min(e, 3.402823466e38f);
                ref.push_back({e, j});
            }
            std::sort(ref.begin(), ref.end(), [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
            for (int i = 0; i < TOPC; i++) {
                const float ev = i < v ? ref[i].first : -INFINITY;
                const bool same = i < v ? (gv[(size_t)r * TOPC + i] == ev && gi[(size_t)r * TOPC + i] == ref[i].second) : gv[(size_t)r * TOPC + i] == -INFINITY;
                if (!same) {
                    if (bad < 5) printf("  row %d place %d: got (%g, %d), want (%g, %d)\n", r, i, gv[(size_t)r * TOPC + i], gi[(size_t)r * TOPC + i], ev, i < v ? ref[i].second : -1);
                    bad++;
                }
            }
        }
        const float us = time_us(run, 20);
        printf("%-24s %6d x %2d: %s, %.1f us\n", c.what, v, m, bad ? "WRONG" : "exact", us);
        ok &= bad == 0;
        CK(cudaFree(dx));
        CK(cudaFree(buf));
    }
    printf("%s\n", ok ? "TOP CHECK: PASS" : "TOP CHECK: FAIL");
    return ok ? 0 : 1;
}
