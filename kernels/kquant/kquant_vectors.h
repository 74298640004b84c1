// The vector operations of the interleaved AVX-512 kernels (kquant_vnni.cpp, and kquant_amx.cpp's unpacking and
// epilogue): two widths over the same layouts, so that every kernel built on them does the same lane operations.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

// Per function rather than for the file (GCC and clang both take it): the library stays loadable on AVX2-only CPUs.
#define KQ_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

namespace kquant {

// Two vector widths, one kernel each for Q4_K and Q6_K (templates over W below):
//   W8:  256-bit vectors, one group of 8 rows per call: one load stream, what decode steps (M = 1, 2) stream
//        from memory fastest;
//   W16: 512-bit vectors, two groups side by side (lanes 0-7 = rows 8g..8g+7, lanes 8-15 = the next group's; a
//        group g1 == g0 for the last of an odd count is computed twice and stored once): half the instructions per
//        weight, for passes of 5 or more rows (prefill, long verifies), where the tiles reuse weights from cache.
// Every lane does the same operations in both, so both give the AVX2 kernels' numbers bit for bit.
struct W8 {
    using I = __m256i;
    using F = __m256;
    static KQ_VNNI I load(const uint8_t* b, const uint8_t*) {
        return _mm256_loadu_si256(reinterpret_cast<const I*>(b));
    }
    static KQ_VNNI F fp16(const uint8_t* b, const uint8_t*) {  // 8 fp16 -> 8 fp32
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    }
    static KQ_VNNI I bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
    static KQ_VNNI I words(int v) { return _mm256_set1_epi32(v); }
    static KQ_VNNI I bcast4(const void* p) {  // 4 bytes at p in every 32-bit lane
        return _mm256_castps_si256(_mm256_broadcast_ss(static_cast<const float*>(p)));
    }
    static KQ_VNNI I zero() { return _mm256_setzero_si256(); }
    static KQ_VNNI I and_(I a, I b) { return _mm256_and_si256(a, b); }
    static KQ_VNNI I or_(I a, I b) { return _mm256_or_si256(a, b); }
    static KQ_VNNI I add(I a, I b) { return _mm256_add_epi32(a, b); }
    static KQ_VNNI I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
    static KQ_VNNI I mullo(I a, I b) { return _mm256_mullo_epi32(a, b); }
    static KQ_VNNI I madd16(I a, I b) { return _mm256_madd_epi16(a, b); }
    static KQ_VNNI I dpbusd(I acc, I u8, I s8) { return _mm256_dpbusd_epi32(acc, u8, s8); }
    static KQ_VNNI I srl16(I a, int n) { return _mm256_srli_epi16(a, n); }
    static KQ_VNNI I sll16(I a, int n) { return _mm256_slli_epi16(a, n); }
    static KQ_VNNI I sra16(I a, int n) { return _mm256_srai_epi16(a, n); }
    static KQ_VNNI I srl32(I a, int n) { return _mm256_srli_epi32(a, n); }
    static KQ_VNNI I sll32(I a, int n) { return _mm256_slli_epi32(a, n); }
    static KQ_VNNI I sra32(I a, int n) { return _mm256_srai_epi32(a, n); }
    static KQ_VNNI I shuffle(I a, const int8_t* m32) {
        return _mm256_shuffle_epi8(a, _mm256_load_si256(reinterpret_cast<const I*>(m32)));
    }
    static KQ_VNNI F fzero() { return _mm256_setzero_ps(); }
    static KQ_VNNI F fmadd_i(I a, F b, F c) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), b, c); }
    static KQ_VNNI F mul_s(F a, float s) { return _mm256_mul_ps(a, _mm256_set1_ps(s)); }
    static KQ_VNNI F fsub(F a, F b) { return _mm256_sub_ps(a, b); }
    static KQ_VNNI void store(float* dst, F v, bool) { _mm256_storeu_ps(dst, v); }
};

struct W16 {
    using I = __m512i;
    using F = __m512;
    static KQ_VNNI I load(const uint8_t* b, const uint8_t* c) {
        return _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)), 1);
    }
    static KQ_VNNI F fp16(const uint8_t* b, const uint8_t* c) {  // 8 fp16 of each group -> 16 fp32
        return _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)),
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b))));
    }
    static KQ_VNNI I bytes(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
    static KQ_VNNI I words(int v) { return _mm512_set1_epi32(v); }
    static KQ_VNNI I bcast4(const void* p) {
        int32_t v;
        std::memcpy(&v, p, 4);
        return _mm512_set1_epi32(v);
    }
    static KQ_VNNI I zero() { return _mm512_setzero_si512(); }
    static KQ_VNNI I and_(I a, I b) { return _mm512_and_si512(a, b); }
    static KQ_VNNI I or_(I a, I b) { return _mm512_or_si512(a, b); }
    static KQ_VNNI I add(I a, I b) { return _mm512_add_epi32(a, b); }
    static KQ_VNNI I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
    static KQ_VNNI I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
    static KQ_VNNI I madd16(I a, I b) { return _mm512_madd_epi16(a, b); }
    static KQ_VNNI I dpbusd(I acc, I u8, I s8) { return _mm512_dpbusd_epi32(acc, u8, s8); }
    static KQ_VNNI I srl16(I a, int n) { return _mm512_srli_epi16(a, n); }
    static KQ_VNNI I sll16(I a, int n) { return _mm512_slli_epi16(a, n); }
    static KQ_VNNI I sra16(I a, int n) { return _mm512_srai_epi16(a, n); }
    static KQ_VNNI I srl32(I a, int n) { return _mm512_srli_epi32(a, n); }
    static KQ_VNNI I sll32(I a, int n) { return _mm512_slli_epi32(a, n); }
    static KQ_VNNI I sra32(I a, int n) { return _mm512_srai_epi32(a, n); }
    static KQ_VNNI I shuffle(I a, const int8_t* m32) {  // the mask's two equal 16-byte halves, in all four lanes
        return _mm512_shuffle_epi8(a, _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(m32))));
    }
    static KQ_VNNI F fzero() { return _mm512_setzero_ps(); }
    static KQ_VNNI F fmadd_i(I a, F b, F c) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), b, c); }
    static KQ_VNNI F mul_s(F a, float s) { return _mm512_mul_ps(a, _mm512_set1_ps(s)); }
    static KQ_VNNI F fsub(F a, F b) { return _mm512_sub_ps(a, b); }
    static KQ_VNNI void store(float* dst, F v, bool both) {
        if (both)
            _mm512_storeu_ps(dst, v);
        else
            _mm256_storeu_ps(dst, _mm512_castps512_ps256(v));
    }
};

template <class V>
KQ_VNNI inline typename V::I byte_u32(typename V::I v, int k) {  // byte k of each 32-bit lane, zero-extended
    return V::and_(V::srl32(v, 8 * k), V::words(0xFF));
}

template <class V>
KQ_VNNI inline typename V::I byte_s32(typename V::I v, int k) {  // byte k of each 32-bit lane, sign-extended
    return V::sra32(V::sll32(v, 24 - 8 * k), 24);
}

}  // namespace kquant
