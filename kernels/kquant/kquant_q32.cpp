// Q8_0, Q5_0 and Q4_1 (ggml's blocks of 32 values) on AVX2, rows interleaved by 8 (layouts in kquant.h), and the int8
// rounding of activations per 32 they take. The AVX-512 VNNI kernels (kquant_q32_vnni.cpp) give the same numbers.
//
// Per weight block and activation row: the integer dot product of the 32 codes (exact: Q8_0 as |w| times a with
// w's sign, <= 2 * 128 * 127 per int16 pair; Q5_0 as the unsigned 5-bit codes times a, <= 4 * 2 * 31 * 127 in
// int16 over 4 chunks, minus 16 * the sum of a; Q4_1 as its unsigned 4-bit codes times a), then acc =
// fma(float(isum), d_w * d_a, acc) in fp32 (Q4_1: then acc = fma(m_w, d_a * sum of a, acc)), 8 weight rows per
// vector. Build with -ffp-contract=off (the float operations are the intrinsics' own).
#include <immintrin.h>

#include <cstring>

#include "kquant.h"
#include "kquant_q32.h"

namespace kquant {
namespace {

template <int R>
void q8_0_x8_rows(const BlockQ32* const* a, int64_t nb, const uint8_t* w, int64_t g, float* const* out) {
    const uint8_t* base = w + g * nb * Q8_0_X8_BYTES;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = base + i * Q8_0_X8_BYTES;
        q32_prefetch(b, Q8_0_X8_BYTES);
        const __m256 dw = q32_fp16x8(b);
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int t = 0; t < 8; ++t) {
            const __m256i q = q32_load(b + 16 + 32 * t);
            const __m256i uq = _mm256_sign_epi8(q, q);  // |q| as unsigned (-128 -> 128)
            for (int r = 0; r < R; ++r) {
                const __m256i sa = _mm256_sign_epi8(q32_bcast4(a[r][i].qs + 4 * t), q);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(uq, sa), ones));
            }
        }
        q32_block_end<R>(isum, 0, dw, a, i, acc);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * g, acc[r]);
}

// The 5th bits of a chunk (values 4c .. 4c + 3 of 8 rows), the layout's 32-bit mask at ``m``, as 0x10 in the bytes
// they belong to: byte j of the vector takes bit j of the mask.
inline __m256i q5_high(const uint8_t* m) {
    int32_t word;
    std::memcpy(&word, m, 4);
    const __m256i rep = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(word), rep), bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

template <int R>
void q5_0_x8_rows(const BlockQ32* const* a, int64_t nb, const uint8_t* w, int64_t g, float* const* out) {
    const uint8_t* base = w + g * nb * Q5_0_X8_BYTES;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = base + i * Q5_0_X8_BYTES;
        q32_prefetch(b, Q5_0_X8_BYTES);
        const __m256 dw = q32_fp16x8(b);
        __m256i p16[R];  // int16 sums of 4 chunks' pairs: <= 4 * 2 * 31 * 127 = 31496
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int half = 0; half < 2; ++half) {  // chunks 0-3 (low nibbles), 4-7 (high nibbles)
            for (int r = 0; r < R; ++r) p16[r] = _mm256_setzero_si256();
            for (int t = 0; t < 4; ++t) {
                const __m256i v = q32_load(b + 48 + 32 * t);
                const int c = 4 * half + t;
                const __m256i nib = half == 0 ? _mm256_and_si256(v, m4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                const __m256i x = _mm256_or_si256(nib, q5_high(b + 16 + 4 * c));
                for (int r = 0; r < R; ++r)
                    p16[r] = _mm256_add_epi16(p16[r], _mm256_maddubs_epi16(x, q32_bcast4(a[r][i].qs + 4 * c)));
            }
            for (int r = 0; r < R; ++r) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p16[r], ones));
        }
        q32_block_end<R>(isum, 16, dw, a, i, acc);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * g, acc[r]);
}

template <int R>
void q4_1_x8_rows(const BlockQ32* const* a, int64_t nb, const uint8_t* w, int64_t g, float* const* out) {
    const uint8_t* base = w + g * nb * Q4_1_X8_BYTES;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = base + i * Q4_1_X8_BYTES;
        q32_prefetch(b, Q4_1_X8_BYTES);
        const __m256 dw = q32_fp16x8(b), mw = q32_fp16x8(b + 16);
        __m256i p16[R];  // int16 sums of 4 chunks' pairs: <= 4 * 2 * 15 * 127 = 15240
        __m256i isum[R];
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        for (int half = 0; half < 2; ++half) {  // chunks 0-3 (low nibbles), 4-7 (high nibbles)
            for (int r = 0; r < R; ++r) p16[r] = _mm256_setzero_si256();
            for (int t = 0; t < 4; ++t) {
                const __m256i v = q32_load(b + 32 + 32 * t);
                const int c = 4 * half + t;
                const __m256i x = half == 0 ? _mm256_and_si256(v, m4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                for (int r = 0; r < R; ++r)
                    p16[r] = _mm256_add_epi16(p16[r], _mm256_maddubs_epi16(x, q32_bcast4(a[r][i].qs + 4 * c)));
            }
            for (int r = 0; r < R; ++r) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p16[r], ones));
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

void quantize_row_q32(const float* x, BlockQ32* y, int64_t k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    for (int64_t i = 0; i < k / QK32; ++i, x += QK32) {
        BlockQ32& b = y[i];
        __m256 vmax = _mm256_setzero_ps();
        for (int j = 0; j < QK32; j += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        if (!(amax > 0.0f)) {
            std::memset(&b, 0, sizeof b);
            continue;
        }
        const float iscale = 127.0f / amax;
        const __m256 vs = _mm256_set1_ps(iscale);
        __m256i v[4];
        for (int t = 0; t < 4; ++t)  // cvtps rounds to nearest even
            v[t] = _mm256_max_epi32(lo, _mm256_min_epi32(hi, _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 8 * t)))));
        const __m256i p01 = _mm256_packs_epi32(v[0], v[1]), p23 = _mm256_packs_epi32(v[2], v[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);  // lanes interleaved by 128-bit halves: put them back
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.qs), p);
        int s = 0;
        for (int j = 0; j < QK32; ++j) s += b.qs[j];
        b.sum = s;
        b.d = 1.0f / iscale;
    }
}

void gemm32_x8(int ggml_type, const BlockQ32* q, int64_t m, int64_t nb, const uint8_t* w, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    static const bool vnni = std::strcmp(x8_isa(), "avx512vnni") == 0;
    if (vnni) {
        gemm32_x8_vnni(ggml_type, q, m, nb, w, n0, n1, out, ldo);
        return;
    }
    q32_tiles(ggml_type == GGML_Q8_0 ? kQ8 : ggml_type == GGML_Q5_0 ? kQ5 : kQ41, q, m, nb, w, n0, n1, out, ldo);
}

}  // namespace kquant
