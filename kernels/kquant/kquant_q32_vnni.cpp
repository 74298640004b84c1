// kquant_q32.cpp's Q8_0 / Q5_0 / Q4_1 kernels on AVX-512 VNNI (256-bit vectors), for the CPUs that have it; the AVX2
// kernels' numbers bit for bit: the same integer dot product per block (vpdpbusd of unsigned codes and signed
// activations: Q8_0's codes offset by 128, then 128 * the sum of a taken off; Q5_0's 5th bits set under a mask),
// Q4_1's codes as they are), the same float operations in the same order.
#include <immintrin.h>

#include <cstring>

#include "kquant.h"
#include "kquant_q32.h"

// Per function rather than for the file: the library stays loadable on AVX2-only CPUs.
#define KQ_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

namespace kquant {
namespace {

template <int R>
KQ_VNNI void q8_0_x8_rows(const BlockQ32* const* a, int64_t nb, const uint8_t* w, int64_t g, float* const* out) {
    const uint8_t* base = w + g * nb * Q8_0_X8_BYTES;
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = base + i * Q8_0_X8_BYTES;
        q32_prefetch(b, Q8_0_X8_BYTES);
        const __m256 dw = q32_fp16x8(b);
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int t = 0; t < 8; ++t) {
            const __m256i uq = _mm256_xor_si256(q32_load(b + 16 + 32 * t), flip);  // q + 128
            for (int r = 0; r < R; ++r) isum[r] = _mm256_dpbusd_epi32(isum[r], uq, q32_bcast4(a[r][i].qs + 4 * t));
        }
        q32_block_end<R>(isum, 128, dw, a, i, acc);
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
    for (int r = 0; r < R; ++r) isum[r] = _mm256_dpbusd_epi32(isum[r], x, q32_bcast4(a[r][i].qs + 4 * C));
}

template <int R>
KQ_VNNI void q5_0_x8_rows(const BlockQ32* const* a, int64_t nb, const uint8_t* w, int64_t g, float* const* out) {
    const uint8_t* base = w + g * nb * Q5_0_X8_BYTES;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = base + i * Q5_0_X8_BYTES;
        q32_prefetch(b, Q5_0_X8_BYTES);
        const __m256 dw = q32_fp16x8(b);
        const uint8_t* hm = b + 16;
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        const __m256i v0 = q32_load(b + 48), v1 = q32_load(b + 80), v2 = q32_load(b + 112), v3 = q32_load(b + 144);
        q5_chunk<R, 0>(isum, _mm256_and_si256(v0, m4), hm, a, i);
        q5_chunk<R, 1>(isum, _mm256_and_si256(v1, m4), hm, a, i);
        q5_chunk<R, 2>(isum, _mm256_and_si256(v2, m4), hm, a, i);
        q5_chunk<R, 3>(isum, _mm256_and_si256(v3, m4), hm, a, i);
        q5_chunk<R, 4>(isum, _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4), hm, a, i);
        q5_chunk<R, 5>(isum, _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4), hm, a, i);
        q5_chunk<R, 6>(isum, _mm256_and_si256(_mm256_srli_epi16(v2, 4), m4), hm, a, i);
        q5_chunk<R, 7>(isum, _mm256_and_si256(_mm256_srli_epi16(v3, 4), m4), hm, a, i);
        q32_block_end<R>(isum, 16, dw, a, i, acc);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * g, acc[r]);
}

template <int R>
KQ_VNNI void q4_1_x8_rows(const BlockQ32* const* a, int64_t nb, const uint8_t* w, int64_t g, float* const* out) {
    const uint8_t* base = w + g * nb * Q4_1_X8_BYTES;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = base + i * Q4_1_X8_BYTES;
        q32_prefetch(b, Q4_1_X8_BYTES);
        const __m256 dw = q32_fp16x8(b), mw = q32_fp16x8(b + 16);
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int t = 0; t < 4; ++t) {
            const __m256i v = q32_load(b + 32 + 32 * t);
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            for (int r = 0; r < R; ++r) {
                isum[r] = _mm256_dpbusd_epi32(isum[r], lo, q32_bcast4(a[r][i].qs + 4 * t));
                isum[r] = _mm256_dpbusd_epi32(isum[r], hi, q32_bcast4(a[r][i].qs + 16 + 4 * t));
            }
        }
        q32_block_end<R>(isum, 0, dw, a, i, acc);
        q32_offset_end<R>(mw, a, i, acc);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * g, acc[r]);
}

constexpr Q32Fn kQ8[4] = {q8_0_x8_rows<1>, q8_0_x8_rows<2>, q8_0_x8_rows<3>, q8_0_x8_rows<4>};
constexpr Q32Fn kQ5[4] = {q5_0_x8_rows<1>, q5_0_x8_rows<2>, q5_0_x8_rows<3>, q5_0_x8_rows<4>};
constexpr Q32Fn kQ41[4] = {q4_1_x8_rows<1>, q4_1_x8_rows<2>, q4_1_x8_rows<3>, q4_1_x8_rows<4>};

}  // namespace

void gemm32_x8_vnni(int ggml_type, const BlockQ32* q, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                    int64_t n1, float* out, int64_t ldo) {
    q32_tiles(ggml_type == GGML_Q8_0 ? kQ8 : ggml_type == GGML_Q5_0 ? kQ5 : kQ41, q, m, nb, w, n0, n1, out, ldo);
}

}  // namespace kquant
