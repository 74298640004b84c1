// The interleaved (x8) kernels of kquant.cpp on AVX-512 VNNI (512-bit vectors holding two groups of 8 rows), for
// the CPUs that have it (AMD Zen 4 / 5, Intel since Cascade Lake); kquant.cpp calls them when the CPU says so.
//
// Same layouts, same integers, same float operations in the same order as the AVX2 kernels, so the outputs are
// the AVX2 kernels' bit for bit: vpdpbusd sums 4 code x activation products into each 32-bit lane directly (the
// AVX2 path gets the same sums through maddubs into int16 and madd with the scale), and each sub-block's sum is
// multiplied by its scale in int32 before it joins the super-block's sum. No sum can overflow: |sum| of a Q4_K
// sub-block <= 32 * 15 * 127, of a Q6_K one <= 16 * 63 * 128. Each 32-bit lane does what the AVX2 kernel's lane
// for the same weight row does; one 512-bit instruction serves 16 weight rows where AVX2 serves 8.
#if defined(__GNUC__) && !defined(__clang__)  // GCC's AVX-512 intrinsics start from _mm512_undefined_*() on purpose
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "kquant.h"
#include "kquant_masks.h"
#include "kquant_vectors.h"

namespace kquant {
namespace {

template <class V, int R>
KQ_VNNI void q4k_rows(const BlockQ8* const* q8, int64_t nb, const uint8_t* w, int64_t g0, int64_t g1,
                      float* const* out) {
    using I = typename V::I;
    using F = typename V::F;
    const I m4 = V::bytes(0x0F), lo6 = V::words(0x3f3f3f3f), lo4 = V::words(0x0f0f0f0f), lo2 = V::words(0x03030303);
    F acc[R], accm[R];
    for (int r = 0; r < R; ++r) acc[r] = accm[r] = V::fzero();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = w + (g0 * nb + i) * Q4_K_X8_BYTES;
        const uint8_t* c = w + (g1 * nb + i) * Q4_K_X8_BYTES;
        prefetch_block(b, Q4_K_X8_BYTES);
        if (c != b) prefetch_block(c, Q4_K_X8_BYTES);
        const F d = V::fp16(b, c), dm = V::fp16(b + 16, c + 16);
        const I p0 = V::load(b + 32, c + 32), p1 = V::load(b + 64, c + 64), p2 = V::load(b + 96, c + 96);
        const I sc03 = V::and_(p0, lo6), mn03 = V::and_(p1, lo6);
        const I sc47 = V::or_(V::and_(p2, lo4), V::sll32(V::and_(V::srl32(p0, 6), lo2), 4));
        const I mn47 = V::or_(V::and_(V::srl32(p2, 4), lo4), V::sll32(V::and_(V::srl32(p1, 6), lo2), 4));
        I isum[R], imin[R];
        for (int r = 0; r < R; ++r) isum[r] = imin[r] = V::zero();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const I& scs = j < 2 ? sc03 : sc47;
            const I s_lo = byte_u32<V>(scs, (2 * j) & 3), s_hi = byte_u32<V>(scs, (2 * j + 1) & 3);
            const I mins = V::shuffle(j < 2 ? mn03 : mn47, kPick[1][(2 * j) & 3]);
            I alo[R], ahi[R];
            for (int r = 0; r < R; ++r) alo[r] = ahi[r] = V::zero();
#pragma GCC unroll 8
            for (int t = 0; t < 8; ++t) {
                const I bits = V::load(b + 128 + 256 * j + 32 * t, c + 128 + 256 * j + 32 * t);
                const I lo = V::and_(bits, m4), hi = V::and_(V::srl16(bits, 4), m4);
                for (int r = 0; r < R; ++r) {
                    const int8_t* a = q8[r][i].qs + 64 * j + 4 * t;
                    alo[r] = V::dpbusd(alo[r], lo, V::bcast4(a));
                    ahi[r] = V::dpbusd(ahi[r], hi, V::bcast4(a + 32));
                }
            }
            for (int r = 0; r < R; ++r) {
                isum[r] = V::add(isum[r], V::add(V::mullo(alo[r], s_lo), V::mullo(ahi[r], s_hi)));
                imin[r] = V::add(imin[r], V::madd16(mins, V::bcast4(q8[r][i].bsums32 + 2 * j)));
            }
        }
        for (int r = 0; r < R; ++r) {
            acc[r] = V::fmadd_i(isum[r], V::mul_s(d, q8[r][i].d), acc[r]);
            accm[r] = V::fmadd_i(imin[r], V::mul_s(dm, q8[r][i].d), accm[r]);
        }
    }
    for (int r = 0; r < R; ++r) V::store(out[r] + 8 * g0, V::fsub(acc[r], accm[r]), g1 != g0);
}

template <class V, int R>
KQ_VNNI void q6k_rows(const BlockQ8* const* q8, int64_t nb, const uint8_t* w, int64_t g0, int64_t g1,
                      float* const* out) {
    using I = typename V::I;
    using F = typename V::F;
    const I m2 = V::bytes(3), m4 = V::bytes(15), m2b = V::bytes(12), m2c = V::bytes(48), m2d = V::bytes(-64);
    F acc[R];
    for (int r = 0; r < R; ++r) acc[r] = V::fzero();
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = w + (g0 * nb + i) * Q6_K_X8_BYTES;
        const uint8_t* c = w + (g1 * nb + i) * Q6_K_X8_BYTES;
        prefetch_block(b, Q6_K_X8_BYTES);
        if (c != b) prefetch_block(c, Q6_K_X8_BYTES);
        const F d = V::fp16(b, c);
        I planes[4];
        for (int p = 0; p < 4; ++p) planes[p] = V::load(b + 16 + 32 * p, c + 16 + 32 * p);
        I isum[R];
        for (int r = 0; r < R; ++r) {  // the codes' -32: 32 * sum over sub-blocks of scale * (sum of a)
            I s = V::zero();
            for (int k = 0; k < 8; ++k) {
                const I pair = V::sra16(V::shuffle(planes[k / 2], kPickSigned[1][(2 * k) % 4]), 8);
                s = V::add(s, V::madd16(pair, V::bcast4(q8[r][i].bsums + 2 * k)));
            }
            isum[r] = V::sub(V::zero(), V::sll32(s, 5));
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
            for (int sb = 0; sb < 2; ++sb) {  // values 16 sb .. 16 sb + 15 of each quarter: 4 sub-blocks
                I s[R][4];
                for (int r = 0; r < R; ++r)
                    for (int k = 0; k < 4; ++k) s[r][k] = V::zero();
#pragma GCC unroll 4
                for (int t = 4 * sb; t < 4 * sb + 4; ++t) {
                    const int64_t v = 144 + 96 * (8 * h + t);  // ql low half, ql high half, qh
                    const I l0 = V::load(b + v, c + v), l1 = V::load(b + v + 32, c + v + 32);
                    const I hb = V::load(b + v + 64, c + v + 64);
                    const I q[4] = {V::or_(V::and_(l0, m4), V::sll16(V::and_(hb, m2), 4)),
                                    V::or_(V::and_(l1, m4), V::sll16(V::and_(hb, m2b), 2)),
                                    V::or_(V::and_(V::srl16(l0, 4), m4), V::and_(hb, m2c)),
                                    V::or_(V::and_(V::srl16(l1, 4), m4), V::srl16(V::and_(hb, m2d), 2))};
                    for (int r = 0; r < R; ++r) {
                        const int8_t* a = q8[r][i].qs + 128 * h + 4 * t;
                        for (int k = 0; k < 4; ++k) s[r][k] = V::dpbusd(s[r][k], q[k], V::bcast4(a + 32 * k));
                    }
                }
                for (int k = 0; k < 4; ++k) {  // sub-block 8h + 2k + sb: scale byte (2k + sb) % 4 of its plane
                    const int sub = 8 * h + 2 * k + sb;
                    const I sc = byte_s32<V>(planes[sub / 4], sub % 4);
                    for (int r = 0; r < R; ++r) isum[r] = V::add(isum[r], V::mullo(s[r][k], sc));
                }
            }
        }
        for (int r = 0; r < R; ++r) acc[r] = V::fmadd_i(isum[r], V::mul_s(d, q8[r][i].d), acc[r]);
    }
    for (int r = 0; r < R; ++r) V::store(out[r] + 8 * g0, acc[r], g1 != g0);
}

using GroupsFn = void (*)(const BlockQ8* const*, int64_t, const uint8_t*, int64_t, int64_t, float* const*);

template <class V>
KQ_VNNI void tiles(bool q4, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t n0, int64_t n1,
                   float* out, int64_t ldo) {
    constexpr int64_t kRowsPerTile = 4, kGroups = sizeof(typename V::F) / 32;  // groups of 8 rows per call: 1 or 2
    static const GroupsFn fns[2][kRowsPerTile] = {
        {q6k_rows<V, 1>, q6k_rows<V, 2>, q6k_rows<V, 3>, q6k_rows<V, 4>},
        {q4k_rows<V, 1>, q4k_rows<V, 2>, q4k_rows<V, 3>, q4k_rows<V, 4>},
    };
    const BlockQ8* rows[kRowsPerTile];
    float* outs[kRowsPerTile];
    for (int64_t g = n0 / 8; g < n1 / 8; g += kGroups) {  // the groups stay in L1 while the tiles pass over them
        const int64_t g1 = g + kGroups - 1 < n1 / 8 ? g + kGroups - 1 : g;
        for (int64_t r0 = 0; r0 < m; r0 += kRowsPerTile) {
            const int64_t t = m - r0 < kRowsPerTile ? m - r0 : kRowsPerTile;
            for (int64_t r = 0; r < t; ++r) {
                rows[r] = q8 + (r0 + r) * nb;
                outs[r] = out + (r0 + r) * ldo;
            }
            fns[q4][t - 1](rows, nb, w, g, g1, outs);
        }
    }
}

}  // namespace

KQ_VNNI void gemm_rows_x8_vnni(int ggml_type, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                               int64_t n1, float* out, int64_t ldo) {
    // Rows from which the 512-bit kernels win in a whole pass of the 1.5B coder target (2 threads, 2026-12-02,
    // BENCHMARKS.md "AVX-512 VNNI"): 1 / 2 / 3 / 4 / 5 / 16 rows took 32 / 36 / 47 / 60 / 81 / 190 ms with 256-bit
    // vectors, 44 / 51 / 57 / 62 / 67 / 117 with 512-bit: two load streams are slower from memory, faster from cache.
    constexpr int64_t kWideFrom = 5;
    if (m >= kWideFrom)
        tiles<W16>(ggml_type == GGML_Q4_K, q8, m, nb, w, n0, n1, out, ldo);
    else
        tiles<W8>(ggml_type == GGML_Q4_K, q8, m, nb, w, n0, n1, out, ldo);
}

}  // namespace kquant
