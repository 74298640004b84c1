// kquant_q32.cpp's Q8_0 / Q5_0 kernels on AVX-512 VNNI (256-bit vectors), for the CPUs that have it; the AVX2
// kernels' numbers bit for bit: the same integer dot product per block (vpdpbusd of unsigned codes and signed
// activations: Q8_0's codes offset by 128, then 128 * the sum of a taken off; Q5_0's 5th bits set under a mask),
// the same float operations in the same order.
#include <immintrin.h>

#include <cstring>

#include "kquant.h"

// Per function rather than for the file: the library stays loadable on AVX2-only CPUs.
#define KQ_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

namespace kquant {
namespace {

constexpr int kAheadBytes = 1024;  // as kquant_q32.cpp

KQ_VNNI inline __m256i bcast4(const int8_t* p) {
    return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(p)));
}

KQ_VNNI inline __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

KQ_VNNI inline __m256 fp16x8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void prefetch(const uint8_t* b, int bytes) {
    for (int l = 0; l < bytes; l += 64) __builtin_prefetch(b + kAheadBytes + l, 0, 3);
}

template <int R>
KQ_VNNI void q8_0_x8_rows(const BlockQ32* const* a, int64_t nb, const uint8_t* w, int64_t g, float* const* out) {
    const uint8_t* base = w + g * nb * Q8_0_X8_BYTES;
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = base + i * Q8_0_X8_BYTES;
        prefetch(b, Q8_0_X8_BYTES);
        const __m256 dw = fp16x8(b);
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int t = 0; t < 8; ++t) {
            const __m256i uq = _mm256_xor_si256(load(b + 16 + 32 * t), flip);  // q + 128
            for (int r = 0; r < R; ++r) isum[r] = _mm256_dpbusd_epi32(isum[r], uq, bcast4(a[r][i].qs + 4 * t));
        }
        for (int r = 0; r < R; ++r) {
            const __m256i off = _mm256_set1_epi32(128 * a[r][i].sum);
            const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(a[r][i].d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r], off)), s, acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * g, acc[r]);
}

// Chunk C (values 4C .. 4C + 3 of 8 rows): the codes' low 4 bits ``nib`` plus 16 where the layout's mask at ``hm``
// (32 bits, one per byte) says the 5th bit is set.
template <int R, int C>
KQ_VNNI inline void q5_chunk(__m256i* isum, __m256i nib, const uint8_t* hm, const BlockQ32* const* a, int64_t i) {
    uint32_t word;
    std::memcpy(&word, hm + 4 * C, 4);
    const __m256i x = _mm256_mask_add_epi8(nib, _cvtu32_mask32(word), nib, _mm256_set1_epi8(0x10));
    for (int r = 0; r < R; ++r) isum[r] = _mm256_dpbusd_epi32(isum[r], x, bcast4(a[r][i].qs + 4 * C));
}

template <int R>
KQ_VNNI void q5_0_x8_rows(const BlockQ32* const* a, int64_t nb, const uint8_t* w, int64_t g, float* const* out) {
    const uint8_t* base = w + g * nb * Q5_0_X8_BYTES;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = base + i * Q5_0_X8_BYTES;
        prefetch(b, Q5_0_X8_BYTES);
        const __m256 dw = fp16x8(b);
        const uint8_t* hm = b + 16;
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        const __m256i v0 = load(b + 48), v1 = load(b + 80), v2 = load(b + 112), v3 = load(b + 144);
        q5_chunk<R, 0>(isum, _mm256_and_si256(v0, m4), hm, a, i);
        q5_chunk<R, 1>(isum, _mm256_and_si256(v1, m4), hm, a, i);
        q5_chunk<R, 2>(isum, _mm256_and_si256(v2, m4), hm, a, i);
        q5_chunk<R, 3>(isum, _mm256_and_si256(v3, m4), hm, a, i);
        q5_chunk<R, 4>(isum, _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), hm, a, i);
        q5_chunk<R, 5>(isum, _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), hm, a, i);
        q5_chunk<R, 6>(isum, _mm256_and_si256(_mm256_srli_epi16(v2, 4), m4), hm, a, i);
        q5_chunk<R, 7>(isum, _mm256_and_si256(_mm256_srli_epi16(v3, 4), m4), hm, a, i);
        for (int r = 0; r < R; ++r) {
            const __m256i off = _mm256_set1_epi32(16 * a[r][i].sum);
            const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(a[r][i].d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r], off)), s, acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * g, acc[r]);
}

using X8Fn = void (*)(const BlockQ32* const*, int64_t, const uint8_t*, int64_t, float* const*);

template <int R>
X8Fn pick(int ggml_type) {
    return ggml_type == GGML_Q8_0 ? q8_0_x8_rows<R> : q5_0_x8_rows<R>;
}

}  // namespace

void gemm32_x8_vnni(int ggml_type, const BlockQ32* q, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                    int64_t n1, float* out, int64_t ldo) {
    constexpr int64_t kRowsPerTile = 4;
    const BlockQ32* rows[kRowsPerTile];
    float* outs[kRowsPerTile];
    for (int64_t g = n0 / 8; g < n1 / 8; ++g) {
        for (int64_t r0 = 0; r0 < m; r0 += kRowsPerTile) {
            const int64_t t = m - r0 < kRowsPerTile ? m - r0 : kRowsPerTile;
            for (int64_t r = 0; r < t; ++r) {
                rows[r] = q + (r0 + r) * nb;
                outs[r] = out + (r0 + r) * ldo;
            }
            const X8Fn fn = t == 4 ? pick<4>(ggml_type) : t == 3 ? pick<3>(ggml_type)
                            : t == 2 ? pick<2>(ggml_type) : pick<1>(ggml_type);
            fn(rows, nb, w, g, outs);
        }
    }
}

}  // namespace kquant
