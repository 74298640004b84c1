// The kernels alone, no ONNX Runtime: CPU time per call on synthetic blocks, one thread.
//   ./bench_kernels TYPE N K M [REPEATS]   TYPE: q4k | q6k | q4k_x8 | q6k_x8
// With N * K small enough for L2 (e.g. 512 x 1536) this is the kernels' compute; large N streams from memory.
// CPU time (CLOCK_THREAD_CPUTIME_ID) rather than wall time, so that time-slicing on a busy machine is not counted.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "kquant.h"

static double cpu_ms() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

int main(int argc, char** argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s q4k|q6k|q4k_x8|q6k_x8 N K M [REPEATS]\n", argv[0]);
        return 2;
    }
    const std::string kind = argv[1];
    const long n = std::atol(argv[2]), k = std::atol(argv[3]);
    const int m = std::atoi(argv[4]), repeats = argc > 5 ? std::atoi(argv[5]) : 200;
    const int type = kind.rfind("q4k", 0) == 0 ? kquant::GGML_Q4_K : kquant::GGML_Q6_K;
    const bool x8 = kind.size() > 3;
    if (k % kquant::QK || (x8 && n % 8)) {
        std::fprintf(stderr, "K must be a multiple of 256 (and N of 8 for x8)\n");
        return 2;
    }
    const long nb = k / kquant::QK, row_bytes = nb * kquant::block_bytes(type);
    std::vector<uint8_t> w(static_cast<size_t>(n * row_bytes));
    std::mt19937 rng(1);
    for (auto& b : w) b = static_cast<uint8_t>(rng());
    const uint16_t small = 0x2c00;  // fp16 0.0625 for every d / dmin, so the sums stay finite
    for (long blk = 0; blk < n * nb; ++blk) {
        uint8_t* b = &w[static_cast<size_t>(blk) * kquant::block_bytes(type)];
        if (type == kquant::GGML_Q4_K) {
            std::memcpy(b, &small, 2);
            std::memcpy(b + 2, &small, 2);
        } else {
            std::memcpy(b + 208, &small, 2);
        }
    }
    std::vector<float> a(static_cast<size_t>(m * k));
    for (auto& v : a) v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
    std::vector<kquant::BlockQ8> q(static_cast<size_t>(m * nb));
    for (int r = 0; r < m; ++r) kquant::quantize_row_q8(&a[r * k], &q[r * nb], k);
    std::vector<float> y(static_cast<size_t>(m * n));
    std::vector<double> t;
    for (int it = 0; it < repeats; ++it) {
        const double t0 = cpu_ms();
        if (x8)
            kquant::gemm_rows_x8(type, q.data(), m, nb, w.data(), 0, n, y.data(), n);
        else
            kquant::gemm_rows(type, q.data(), m, nb, w.data(), row_bytes, 0, n, y.data(), n);
        t.push_back(cpu_ms() - t0);
    }
    std::sort(t.begin(), t.end());
    const double ms = t[t.size() / 2];
    std::printf("%s N %ld K %ld M %d: %.4f ms (median of %d), %.1f GB/s of weights, %.2f ns per super-block and row\n",
                kind.c_str(), n, k, m, ms, repeats, n * row_bytes / ms / 1e6, ms * 1e6 / (n * nb) / m);
    return 0;
}
