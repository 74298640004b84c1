// AVX2 kernels for kquant.h. Block layouts are the GGUF file's (ggml's block_q4_K / block_q6_K, QK_K = 256):
//
//   Q4_K (144 bytes): fp16 d, fp16 dmin, scales[12] (eight 6-bit scales and eight 6-bit mins), qs[128] (nibbles).
//     Values 64 j + l (j = 0..3, l = 0..31): sub-block 2j from the low nibble of qs[32 j + l], sub-block 2j + 1
//     from its high nibble; w = d * sc[s] * q - dmin * mn[s].
//   Q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], fp16 d. For each half h
//     (128 values), l = 0..31: values l, l+32, l+64, l+96 take the low nibble of ql[64h + l], of ql[64h + l + 32],
//     the high nibble of ql[64h + l], of ql[64h + l + 32], and bits 0-1, 2-3, 4-5, 6-7 of qh[32h + l] on top;
//     w = d * scales[value / 16] * (q - 32).
//
// The arithmetic follows llama.cpp's AVX2 path (ggml-cpu, x86 quants.c): integer products inside a super-block,
// one fp32 fused multiply-add per super-block into 8 (Q4_K mins: 4) lanes, one horizontal sum at the end. It is
// written here from the formats above; only the structure is the same. Build with -ffp-contract=off so that
// the compiler never fuses the scalar float operations differently in the 1- to 4-row variants.
#include "kquant.h"
#include "kquant_masks.h"

#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace kquant {
namespace {

inline float fp16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// A 256-bit shuffle mask repeating the 16-bit lane ``k`` of a 128-bit source (both halves hold the same 8 lanes).
inline __m256i lane16(int k) {
    const int16_t pair = static_cast<int16_t>((2 * k) | ((2 * k + 1) << 8));
    return _mm256_set1_epi16(pair);
}

// ------------------------------------------------------------------------------------------------ Q4_K
// Eight 6-bit scales (low 128 bits, as int16) and mins (high 128 bits) of one super-block's 12 bytes.
inline __m256i q4k_scales_mins(const uint8_t* s12) {
    uint32_t u[3];
    std::memcpy(u, s12, 12);
    const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    const uint32_t sc03 = u[0] & lo6;                                    // scales 0-3: bytes 0-3, low 6 bits
    const uint32_t mn03 = u[1] & lo6;                                    // mins 0-3: bytes 4-7, low 6 bits
    const uint32_t sc47 = (u[2] & lo4) | (((u[0] >> 6) & lo2) << 4);     // low nibble of 8-11, top bits of 0-3
    const uint32_t mn47 = ((u[2] >> 4) & lo4) | (((u[1] >> 6) & lo2) << 4);  // high nibble of 8-11, of 4-7
    return _mm256_cvtepu8_epi16(_mm_set_epi32(static_cast<int>(mn47), static_cast<int>(mn03),
                                              static_cast<int>(sc47), static_cast<int>(sc03)));
}

template <int R>
void q4k_rows(const BlockQ8* const* q8, int64_t nb, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
              float* const* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* row = w + n * row_bytes;
        __m256 acc[R];
        __m128 accm[R];
        for (int r = 0; r < R; ++r) {
            acc[r] = _mm256_setzero_ps();
            accm[r] = _mm_setzero_ps();
        }
        for (int64_t i = 0; i < nb; ++i) {
            const uint8_t* b = row + i * Q4_K_BYTES;
            const float d = fp16(b), dmin = fp16(b + 2);
            const __m256i sm = q4k_scales_mins(b + 4);
            const __m128i mins = _mm256_extracti128_si256(sm, 1);
            const __m128i sc128 = _mm256_castsi256_si128(sm);
            const __m256i scales = _mm256_set_m128i(sc128, sc128);
            const uint8_t* qs = b + 16;
            __m256i sumi[R];
            for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
            for (int j = 0; j < 4; ++j) {
                const __m256i s_lo = _mm256_shuffle_epi8(scales, lane16(2 * j));
                const __m256i s_hi = _mm256_shuffle_epi8(scales, lane16(2 * j + 1));
                const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
                const __m256i lo = _mm256_and_si256(bits, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = q8[r][i].qs + 64 * j;
                    const __m256i alo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
                    const __m256i ahi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
                    const __m256i plo = _mm256_madd_epi16(s_lo, _mm256_maddubs_epi16(lo, alo));
                    const __m256i phi = _mm256_madd_epi16(s_hi, _mm256_maddubs_epi16(hi, ahi));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(plo, phi));
                }
            }
            for (int r = 0; r < R; ++r) {
                const BlockQ8& y = q8[r][i];
                const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
                const __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
                const __m128i pm = _mm_madd_epi16(mins, bs32);  // sum over sub-blocks of mn * (sum of a)
                const float dy = y.d * d, my = -y.d * dmin;
                accm[r] = _mm_fmadd_ps(_mm_set1_ps(my), _mm_cvtepi32_ps(pm), accm[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dy), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) out[r][n] = hsum8(acc[r]) + hsum4(accm[r]);
    }
}

// ------------------------------------------------------------------------------------------------ Q6_K
template <int R>
void q6k_rows(const BlockQ8* const* q8, int64_t nb, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
              float* const* out) {
    const __m256i m2 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(15);
    const __m256i m2b = _mm256_set1_epi8(12), m2c = _mm256_set1_epi8(48), m2d = _mm256_set1_epi8(-64);
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* row = w + n * row_bytes;
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; ++i) {
            const uint8_t* b = row + i * Q6_K_BYTES;
            const uint8_t* ql = b;
            const uint8_t* qh = b + 128;
            const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
            const float d = fp16(b + 208);
            const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
            __m256i sumi[R];
            for (int r = 0; r < R; ++r) {  // the -32 of every code: 32 * sum over sub-blocks of sc * (sum of a)
                const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8[r][i].bsums));
                sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
            }
            for (int h = 0; h < 2; ++h) {
                const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
                const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
                const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2b), 2));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m2c));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_srli_epi16(_mm256_and_si256(hb, m2d), 2));
                __m256i s[4];
                for (int k = 0; k < 4; ++k) {  // sub-blocks 8h + 2k (values 0-15 of q[k]) and 8h + 2k + 1
                    const int lo = 8 * h + 2 * k;
                    s[k] = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(static_cast<int8_t>(b[192 + lo + 1]))),
                                            _mm_set1_epi16(static_cast<int16_t>(static_cast<int8_t>(b[192 + lo]))));
                }
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = q8[r][i].qs + 128 * h;
                    __m256i t = sumi[r];
                    for (int k = 0; k < 4; ++k) {
                        const __m256i ak = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32 * k));
                        t = _mm256_add_epi32(t, _mm256_madd_epi16(s[k], _mm256_maddubs_epi16(q[k], ak)));
                    }
                    sumi[r] = t;
                }
            }
            for (int r = 0; r < R; ++r) {
                const float dy = q8[r][i].d * d;
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dy), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) out[r][n] = hsum8(acc[r]);
    }
}


// ------------------------------------------------------------------------------------------------ Q4_K x8
// Eight rows of W at once (layout in kquant.h): each 256-bit load holds 4 codes of each row; the activations'
// 4 matching bytes are broadcast, so one maddubs serves 8 rows, and a sub-block's 8 maddubs are summed in int16
// (at most 8 * 2 * 15 * 127 = 30480) before one madd applies the 8 rows' scales.
// Shuffle masks (kquant_masks.h): int16 lanes (2r, 2r + 1) of the result = bytes (k, k) [pick16] or (k, k + 1)
// [pick16_pair] of 32-bit lane r, zero-extended.

inline __m256i pick16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[0][k])));
}

inline __m256i pick16_pair(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[1][k])));
}

inline __m256i bcast4(const void* p) {  // 4 bytes at p in every 32-bit lane (one broadcast load)
    return _mm256_castps_si256(_mm256_broadcast_ss(static_cast<const float*>(p)));
}

template <int R>
void q4k_x8_rows(const BlockQ8* const* q8, int64_t nb, const uint8_t* w, int64_t g0, int64_t g1, float* const* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i lo6 = _mm256_set1_epi32(0x3f3f3f3f), lo4 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i lo2 = _mm256_set1_epi32(0x03030303);
    for (int64_t g = g0; g < g1; ++g) {
        __m256 acc[R], accm[R];
        for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; ++i) {
            const uint8_t* b = w + (g * nb + i) * Q4_K_X8_BYTES;
            prefetch_block(b, Q4_K_X8_BYTES);
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
            const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));
            const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
            const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64));
            const __m256i p2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 96));
            const __m256i sc03 = _mm256_and_si256(p0, lo6), mn03 = _mm256_and_si256(p1, lo6);
            const __m256i sc47 = _mm256_or_si256(_mm256_and_si256(p2, lo4),
                                                 _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(p0, 6), lo2), 4));
            const __m256i mn47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(p2, 4), lo4),
                                                 _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(p1, 6), lo2), 4));
            const uint8_t* qs = b + 128;
            __m256i isum[R], imin[R];
            for (int r = 0; r < R; ++r) isum[r] = imin[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const __m256i& scs = j < 2 ? sc03 : sc47;
                const __m256i s_lo = pick16(scs, (2 * j) & 3), s_hi = pick16(scs, (2 * j + 1) & 3);
                const __m256i mins = pick16_pair(j < 2 ? mn03 : mn47, (2 * j) & 3);
                __m256i alo[R], ahi[R];
                for (int r = 0; r < R; ++r) alo[r] = ahi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int t = 0; t < 8; ++t) {
                    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 256 * j + 32 * t));
                    const __m256i lo = _mm256_and_si256(bits, m4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                    for (int r = 0; r < R; ++r) {
                        const int8_t* a = q8[r][i].qs + 64 * j + 4 * t;
                        alo[r] = _mm256_add_epi16(alo[r], _mm256_maddubs_epi16(lo, bcast4(a)));
                        ahi[r] = _mm256_add_epi16(ahi[r], _mm256_maddubs_epi16(hi, bcast4(a + 32)));
                    }
                }
                for (int r = 0; r < R; ++r) {
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(alo[r], s_lo),
                                                                         _mm256_madd_epi16(ahi[r], s_hi)));
                    imin[r] = _mm256_add_epi32(imin[r], _mm256_madd_epi16(mins, bcast4(q8[r][i].bsums32 + 2 * j)));
                }
            }
            for (int r = 0; r < R; ++r) {
                const __m256 ad = _mm256_set1_ps(q8[r][i].d);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d8, ad), acc[r]);
                accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[r]), _mm256_mul_ps(m8, ad), accm[r]);
            }
        }
        for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * g, _mm256_sub_ps(acc[r], accm[r]));
    }
}


// ------------------------------------------------------------------------------------------------ Q6_K x8
// Eight rows at once as for Q4_K; codes reach 63, so two maddubs (at most 2 * 2 * 63 * 127 = 32004) are summed
// in int16 before each madd with the rows' scales; the codes' -32 is taken off through the sums per 16.

inline __m256i pick_signed(__m256i v, int pair, int k) {  // sign-extended int8 -> int16
    const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPickSigned[pair][k]));
    return _mm256_srai_epi16(_mm256_shuffle_epi8(v, m), 8);
}

template <int R>
void q6k_x8_rows(const BlockQ8* const* q8, int64_t nb, const uint8_t* w, int64_t g0, int64_t g1, float* const* out) {
    const __m256i m2 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(15);
    const __m256i m2b = _mm256_set1_epi8(12), m2c = _mm256_set1_epi8(48), m2d = _mm256_set1_epi8(-64);
    for (int64_t g = g0; g < g1; ++g) {
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; ++i) {
            const uint8_t* b = w + (g * nb + i) * Q6_K_X8_BYTES;
            prefetch_block(b, Q6_K_X8_BYTES);
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
            __m256i planes[4], scv[16], pairs[8];
            for (int p = 0; p < 4; ++p) planes[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * p));
            for (int s = 0; s < 16; ++s) scv[s] = pick_signed(planes[s / 4], 0, s % 4);
            for (int s = 0; s < 8; ++s) pairs[s] = pick_signed(planes[s / 2], 1, (2 * s) % 4);
            const uint8_t* qv = b + 144;  // 96 bytes per (h, t): ql low half, ql high half, qh
            __m256i isum[R];
            for (int r = 0; r < R; ++r) {
                __m256i c = _mm256_setzero_si256();
                for (int s = 0; s < 8; ++s) c = _mm256_add_epi32(c, _mm256_madd_epi16(pairs[s], bcast4(q8[r][i].bsums + 2 * s)));
                isum[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(c, 5));
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
                for (int tp = 0; tp < 4; ++tp) {
                    __m256i q[2][4];
                    for (int u = 0; u < 2; ++u) {
                        const int t = 2 * tp + u;
                        const uint8_t* v = qv + 96 * (8 * h + t);
                        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
                        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32));
                        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 64));
                        q[u][0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
                        q[u][1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2b), 2));
                        q[u][2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m2c));
                        q[u][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                                  _mm256_srli_epi16(_mm256_and_si256(hb, m2d), 2));
                    }
                    const int sb = tp / 2;
                    for (int r = 0; r < R; ++r) {
                        const int8_t* a = q8[r][i].qs + 128 * h + 8 * tp;
                        __m256i t = isum[r];
                        for (int k = 0; k < 4; ++k) {
                            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(q[0][k], bcast4(a + 32 * k)),
                                                                 _mm256_maddubs_epi16(q[1][k], bcast4(a + 32 * k + 4)));
                            t = _mm256_add_epi32(t, _mm256_madd_epi16(s16, scv[8 * h + 2 * k + sb]));
                        }
                        isum[r] = t;
                    }
                }
            }
            for (int r = 0; r < R; ++r)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d8, _mm256_set1_ps(q8[r][i].d)), acc[r]);
        }
        for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * g, acc[r]);
    }
}

// ------------------------------------------------------------------------------------------------ dequantization
// ggml's dequantize_row_q4_K / _q6_K for one super-block, in their order of float operations (fp32, no fusion).
void dequant_q4k_block(const uint8_t* b, float* y) {
    const float d = fp16(b), dmin = fp16(b + 2);
    const uint8_t* s = b + 4;
    const uint8_t* q = b + 16;
    for (int j = 0; j < 4; ++j, q += 32, y += 64) {  // sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles)
        float dl[2], ml[2];
        for (int u = 0; u < 2; ++u) {  // ggml's get_scale_min_k4
            const int k = 2 * j + u;
            const int sc = k < 4 ? s[k] & 63 : (s[k + 4] & 0xF) | ((s[k - 4] >> 6) << 4);
            const int mn = k < 4 ? s[k + 4] & 63 : (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
            dl[u] = d * static_cast<float>(sc);
            ml[u] = dmin * static_cast<float>(mn);
        }
        for (int l = 0; l < 32; ++l) y[l] = dl[0] * static_cast<float>(q[l] & 0xF) - ml[0];
        for (int l = 0; l < 32; ++l) y[32 + l] = dl[1] * static_cast<float>(q[l] >> 4) - ml[1];
    }
}

void dequant_q6k_block(const uint8_t* b, float* y) {
    const float d = fp16(b + 208);
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
            y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
            y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
            y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
        }
    }
}

inline void copy4(uint8_t* dst, const uint8_t* src) { std::memcpy(dst, src, 4); }

// Row r (0..7) of one interleaved super-block (kquant.h) back in the file's block layout.
void unpack_q4k_x8(const uint8_t* b, int r, uint8_t* out) {
    std::memcpy(out, b + 2 * r, 2);
    std::memcpy(out + 2, b + 16 + 2 * r, 2);
    for (int w = 0; w < 3; ++w) copy4(out + 4 + 4 * w, b + 32 + 32 * w + 4 * r);
    for (int j = 0; j < 4; ++j)
        for (int t = 0; t < 8; ++t) copy4(out + 16 + 32 * j + 4 * t, b + 128 + 256 * j + 32 * t + 4 * r);
}

void unpack_q6k_x8(const uint8_t* b, int r, uint8_t* out) {
    std::memcpy(out + 208, b + 2 * r, 2);
    for (int w = 0; w < 4; ++w) copy4(out + 192 + 4 * w, b + 16 + 32 * w + 4 * r);
    for (int h = 0; h < 2; ++h)
        for (int t = 0; t < 8; ++t) {
            const uint8_t* v = b + 144 + 96 * (8 * h + t) + 4 * r;
            copy4(out + 64 * h + 4 * t, v);
            copy4(out + 64 * h + 32 + 4 * t, v + 32);
            copy4(out + 128 + 32 * h + 4 * t, v + 64);
        }
}

using X8Fn = void (*)(const BlockQ8* const*, int64_t, const uint8_t*, int64_t, int64_t, float* const*);

using RowsFn = void (*)(const BlockQ8* const*, int64_t, const uint8_t*, int64_t, int64_t, int64_t, float* const*);

template <int R>
RowsFn pick(int ggml_type) {
    return ggml_type == GGML_Q4_K ? q4k_rows<R> : q6k_rows<R>;
}

}  // namespace

int block_bytes(int ggml_type) {
    switch (ggml_type) {
        case GGML_Q4_K: return Q4_K_BYTES;
        case GGML_Q6_K: return Q6_K_BYTES;
        case GGML_Q5_0: return Q5_0_BYTES;
        case GGML_Q8_0: return Q8_0_BYTES;
        case GGML_Q4_1: return Q4_1_BYTES;
        default: return 0;
    }
}

int block_values(int ggml_type) {
    return ggml_type == GGML_Q4_K || ggml_type == GGML_Q6_K ? QK
           : ggml_type == GGML_Q5_0 || ggml_type == GGML_Q8_0 || ggml_type == GGML_Q4_1 ? QK32 : 0;
}

void quantize_row_q8(const float* x, BlockQ8* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; ++i, x += QK) {
        BlockQ8& b = y[i];
        __m256 vmax = _mm256_setzero_ps();
        const __m256 sign = _mm256_set1_ps(-0.0f);
        for (int j = 0; j < QK; j += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        if (!(amax > 0.0f)) {  // all zero: d = 0, codes 0 (as llama.cpp)
            std::memset(&b, 0, sizeof b);
            continue;
        }
        float mx = 0.0f;  // the first value of largest magnitude, with its sign (llama.cpp keeps the first)
        for (int j = 0; j < QK; ++j) {
            if (std::fabs(x[j]) == amax) {
                mx = x[j];
                break;
            }
        }
        const float iscale = -127.0f / mx;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i cap = _mm256_set1_epi32(127);
        for (int j = 0; j < QK; j += 32) {
            __m256i v[4];
            for (int t = 0; t < 4; ++t)  // cvtps rounds to nearest even, as ggml's nearest_int
                v[t] = _mm256_min_epi32(cap, _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * t))));
            const __m256i p01 = _mm256_packs_epi32(v[0], v[1]), p23 = _mm256_packs_epi32(v[2], v[3]);
            __m256i p = _mm256_packs_epi16(p01, p23);  // lanes interleaved by 128-bit halves: put them back
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.qs + j), p);
        }
        for (int j = 0; j < QK / 16; ++j) {
            int s = 0;
            for (int t = 0; t < 16; ++t) s += b.qs[16 * j + t];
            b.bsums[j] = static_cast<int16_t>(s);
        }
        for (int j = 0; j < QK / 32; ++j) b.bsums32[j] = static_cast<int16_t>(b.bsums[2 * j] + b.bsums[2 * j + 1]);
        b.d = 1.0f / iscale;
    }
}

void dequantize_row(int ggml_type, const uint8_t* w, int64_t nb, int64_t n, float* y) {
    const int bb = block_bytes(ggml_type);
    const uint8_t* row = w + n * nb * bb;
    for (int64_t i = 0; i < nb; ++i, y += QK)
        (ggml_type == GGML_Q4_K ? dequant_q4k_block : dequant_q6k_block)(row + i * bb, y);
}

void dequantize_row_x8(int ggml_type, const uint8_t* w, int64_t nb, int64_t n, float* y) {
    const bool q4 = ggml_type == GGML_Q4_K;
    const int64_t gb = q4 ? Q4_K_X8_BYTES : Q6_K_X8_BYTES;
    const int64_t g = n / 8;
    const int r = static_cast<int>(n % 8);
    uint8_t blk[Q6_K_BYTES];
    for (int64_t i = 0; i < nb; ++i, y += QK) {
        const uint8_t* b = w + (g * nb + i) * gb;
        if (q4) {
            unpack_q4k_x8(b, r, blk);
            dequant_q4k_block(blk, y);
        } else {
            unpack_q6k_x8(b, r, blk);
            dequant_q6k_block(blk, y);
        }
    }
}

void gemm_rows(int ggml_type, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t row_bytes,
               int64_t n0, int64_t n1, float* out, int64_t ldo) {
    // Rows of A in tiles of up to 4 sharing each weight load (every tile size runs the same per-element code);
    // W in strips of 8 rows, so that a strip stays in L1 while the tiles pass over it.
    constexpr int64_t kRowsPerTile = 4, kStrip = 8;
    const BlockQ8* rows[kRowsPerTile];
    float* outs[kRowsPerTile];
    for (int64_t s0 = n0; s0 < n1; s0 += kStrip) {
        const int64_t s1 = s0 + kStrip < n1 ? s0 + kStrip : n1;
        for (int64_t r0 = 0; r0 < m; r0 += kRowsPerTile) {
            const int64_t t = m - r0 < kRowsPerTile ? m - r0 : kRowsPerTile;
            for (int64_t r = 0; r < t; ++r) {
                rows[r] = q8 + (r0 + r) * nb;
                outs[r] = out + (r0 + r) * ldo;
            }
            const RowsFn fn = t == 4 ? pick<4>(ggml_type) : t == 3 ? pick<3>(ggml_type)
                              : t == 2 ? pick<2>(ggml_type) : pick<1>(ggml_type);
            fn(rows, nb, w, row_bytes, s0, s1, outs);
        }
    }
}

bool vnni_supported() {
    return __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

const char* x8_isa() {
    static const char* isa = [] {
        const char* want = std::getenv("EDGE_SPEC_KQUANT_ISA");
        const bool avx2 = want != nullptr && std::strcmp(want, "avx2") == 0;
        const bool vnni = want != nullptr && std::strcmp(want, "avx512vnni") == 0;
        if (avx2 || !vnni_supported()) return "avx2";
        return !vnni && amx_supported() ? "amx" : "avx512vnni";
    }();
    return isa;
}

void gemm_rows_x8(int ggml_type, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                  int64_t n1, float* out, int64_t ldo) {
    static const bool amx = std::strcmp(x8_isa(), "amx") == 0;
    static const bool vnni = amx || std::strcmp(x8_isa(), "avx512vnni") == 0;
    if (amx && m >= kAmxFromRows) {
        gemm_rows_x8_amx(ggml_type, q8, m, nb, w, n0, n1, out, ldo);
        return;
    }
    if (vnni) {
        gemm_rows_x8_vnni(ggml_type, q8, m, nb, w, n0, n1, out, ldo);
        return;
    }
    constexpr int64_t kRowsPerTile = 4;
    const BlockQ8* rows[kRowsPerTile];
    float* outs[kRowsPerTile];
    const bool q4 = ggml_type == GGML_Q4_K;
    for (int64_t g = n0 / 8; g < n1 / 8; ++g) {  // one group of 8 rows stays in L1 while the tiles pass over it
        for (int64_t r0 = 0; r0 < m; r0 += kRowsPerTile) {
            const int64_t t = m - r0 < kRowsPerTile ? m - r0 : kRowsPerTile;
            for (int64_t r = 0; r < t; ++r) {
                rows[r] = q8 + (r0 + r) * nb;
                outs[r] = out + (r0 + r) * ldo;
            }
            const X8Fn fn = t == 4 ? (q4 ? q4k_x8_rows<4> : q6k_x8_rows<4>) : t == 3 ? (q4 ? q4k_x8_rows<3> : q6k_x8_rows<3>)
                            : t == 2 ? (q4 ? q4k_x8_rows<2> : q6k_x8_rows<2>) : (q4 ? q4k_x8_rows<1> : q6k_x8_rows<1>);
            fn(rows, nb, w, g, g + 1, outs);
        }
    }
}

}  // namespace kquant
