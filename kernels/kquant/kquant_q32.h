// What kquant_q32.cpp (AVX2) and kquant_q32_vnni.cpp (AVX-512 VNNI) share: the float end of a block and the row-tile
// driver. Plain AVX2 code, so the VNNI kernels (whose target is a superset) inline it: both ISAs run the very same
// float operations per output, which is what makes their numbers equal bit for bit.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kquant.h"

namespace kquant {

// A group of 8 rows streams once per call: the kernels ask for the bytes this far ahead of the block they compute.
constexpr int kQ32AheadBytes = 1024;

inline __m256i q32_bcast4(const int8_t* p) {  // 4 bytes at p in every 32-bit lane
    return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(p)));
}

inline __m256i q32_load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline __m256 q32_fp16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline void q32_prefetch(const uint8_t* b, int bytes) {
    for (int l = 0; l < bytes; l += 64) __builtin_prefetch(b + kQ32AheadBytes + l, 0, 3);
}


// acc[r] += float(isum[r] - offset * sum of row r's block i) * (d_w * d_a), 8 weight rows per vector. ``offset``: what
// the kernel's unsigned codes exceed the signed ones by (Q5_0: 16; Q8_0 on VNNI: 128; Q8_0 on AVX2: 0).
template <int R>
inline void q32_block_end(const __m256i* isum, int offset, __m256 dw, const BlockQ32* const* a, int64_t i,
                          __m256* acc) {
    for (int r = 0; r < R; ++r) {
        const __m256i off = _mm256_set1_epi32(offset * a[r][i].sum);
        const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(a[r][i].d));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r], off)), s, acc[r]);
    }
}

// Q4_1's offsets: acc[r] += m_w * (d_a * sum of row r's block i), after q32_block_end (8 weight rows per vector).
template <int R>
inline void q32_offset_end(__m256 mw, const BlockQ32* const* a, int64_t i, __m256* acc) {
    for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a[r][i].d * static_cast<float>(a[r][i].sum)), acc[r]);
}

// One kernel of a block type for a tile of t = 1..4 activation rows over one group of 8 weight rows.
using Q32Fn = void (*)(const BlockQ32* const*, int64_t, const uint8_t*, int64_t, float* const*);

// out[r * ldo + n] for n in [n0, n1): each group of 8 weight rows stays in L1 while the tiles of up to 4 activation
// rows pass over it; ``fns[t - 1]`` computes a tile of t rows.
inline void q32_tiles(const Q32Fn* fns, const BlockQ32* q, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
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
            fns[t - 1](rows, nb, w, g, outs);
        }
    }
}

}  // namespace kquant
