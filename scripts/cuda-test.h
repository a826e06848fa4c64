// What the standalone CUDA kernel tests (`scripts/mmq-test.cu`, `scripts/head-test.cu`) share:
// the kernels themselves, an error check and an event timer. Built by `scripts/cuda-test.sh`.
#pragma once
#include "../crates/ruvllm-core/src/backend/cuda/kernels.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Mean microseconds per call of `f` (`calls` calls between events, after 5 warm-up calls),
// median of 7.
template <class F>
static float time_us(F f, int calls) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 5; i++) f();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> v;
    for (int rep = 0; rep < 7; rep++) {
        CK(cudaEventRecord(a));
        for (int i = 0; i < calls; i++) f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        v.push_back(ms * 1000.f / calls);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return median(v);
}
