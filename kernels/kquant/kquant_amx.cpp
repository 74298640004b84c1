// The interleaved (x8) Q4_K / Q6_K kernels for passes of several rows on Intel AMX (AMX-TILE + AMX-INT8: Xeon since
// Sapphire Rapids), beside kquant_vnni.cpp's; kquant.cpp calls them where the CPU and the OS allow the tiles.
//
// Why: from two rows on, the VNNI kernels are compute-bound (each row adds one vpdpbusd per 4 codes of 16 weight
// rows), so a verify pass of k rows costs ~k times the arithmetic of a decode step. Here each sub-block's integer
// dot products for all rows of the pass come from one tile instruction (tdpbssd: C[r][n] += sum_k a[r][k] * q[n][k],
// codes and activations both as signed bytes; the codes are 0..15 / 0..63), and the vector code that remains per
// row is the scale epilogue. The codes are unpacked as the 512-bit VNNI kernel unpacks them (two groups of 8 rows
// side by side, lanes 0-7 and 8-15) into a tile of B rows in L1.
//
// Same integers, same float operations in the same order as the VNNI and AVX2 kernels, so the same outputs bit for
// bit: each sub-block's dot product is an exact int32 whichever instruction sums it, multiplied by its scale in
// int32 and summed over the super-block (int32 addition is exact in any order: no sum can overflow, kquant_vnni.cpp),
// then one fp32 fused multiply-add per super-block as there.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "kquant.h"
#include "kquant_masks.h"
#include "kquant_vectors.h"

// A compiler without the tile intrinsics (GCC < 11, clang < 12) builds the library without this path.
#if defined(__has_include) && (__has_include(<amxtileintrin.h>) || __has_include(<amxintrin.h>))
#define KQ_HAVE_AMX 1
#endif

#ifdef KQ_HAVE_AMX

#define KQ_AMX __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,amx-tile,amx-int8")))

namespace kquant {
namespace {

constexpr int kMaxRows = 16;  // rows of a tile: activation rows per tile pass

// Palette 1: tiles 0-3 are C (rows x 16 int32), 4 and 6 A (rows x kbytes of activations), 5 and 7 B (kbytes / 4
// rows of 16 weight rows x 4 codes).
struct alignas(64) TileConfig {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

KQ_AMX void configure(int m, int kbytes) {
    TileConfig c;
    std::memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int t = 0; t < 4; ++t) {
        c.rows[t] = static_cast<uint8_t>(m);
        c.colsb[t] = 64;
    }
    for (int t = 4; t < 8; t += 2) {
        c.rows[t] = static_cast<uint8_t>(m);
        c.colsb[t] = static_cast<uint16_t>(kbytes);
        c.rows[t + 1] = static_cast<uint8_t>(kbytes / 4);
        c.colsb[t + 1] = 64;
    }
    _tile_loadconfig(&c);
}

KQ_AMX inline __m512i ctile(const int32_t* c) { return _mm512_load_si512(c); }

// C tiles 0-3 += A (4 / 6) x B (5 / 7) for four sub-blocks: activations at a + kbytes * s (rows astride apart),
// codes at bt + s * kbytes * 16; then stored to ct[4][kMaxRows][16].
#define KQ_FOUR_SUBBLOCKS(a, astride, bt, tb, s0)                                          \
    do {                                                                                   \
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);                        \
        _tile_loadd(4, (a) + (tb) * ((s0) + 0), astride); _tile_loadd(5, (bt)[(s0) + 0], 64); \
        _tile_loadd(6, (a) + (tb) * ((s0) + 1), astride); _tile_loadd(7, (bt)[(s0) + 1], 64); \
        _tile_dpbssd(0, 4, 5);                                                             \
        _tile_dpbssd(1, 6, 7);                                                             \
        _tile_loadd(4, (a) + (tb) * ((s0) + 2), astride); _tile_loadd(5, (bt)[(s0) + 2], 64); \
        _tile_loadd(6, (a) + (tb) * ((s0) + 3), astride); _tile_loadd(7, (bt)[(s0) + 3], 64); \
        _tile_dpbssd(2, 4, 5);                                                             \
        _tile_dpbssd(3, 6, 7);                                                             \
        _tile_stored(0, ct[0], 64); _tile_stored(1, ct[1], 64);                           \
        _tile_stored(2, ct[2], 64); _tile_stored(3, ct[3], 64);                           \
    } while (0)

// Rows 8 g0 .. 8 g0 + 7 and 8 g1 .. (lanes 0-7, 8-15; g1 == g0 for the last of an odd count: stored once) of a
// Q4_K tensor interleaved by 8, for m <= 16 activation rows (q8 row r at q8 + r * nb): out[r * ldo + 8 g0 + ...].
KQ_AMX void q4k_amx(const BlockQ8* q8, int m, int64_t nb, const uint8_t* w, int64_t g0, int64_t g1, float* out,
                    int64_t ldo) {
    alignas(64) int8_t bt[8][8 * 64];          // B tiles of the 8 sub-blocks: row t = 16 weight rows x 4 codes
    alignas(64) int32_t ct[4][kMaxRows][16];  // C tiles of four sub-blocks: activation row r, weight row n
    const __m512i m4 = _mm512_set1_epi8(0x0F), lo6 = _mm512_set1_epi32(0x3f3f3f3f);
    const __m512i lo4 = _mm512_set1_epi32(0x0f0f0f0f), lo2 = _mm512_set1_epi32(0x03030303);
    __m512 acc[kMaxRows], accm[kMaxRows];
    for (int r = 0; r < m; ++r) acc[r] = accm[r] = _mm512_setzero_ps();
    const int64_t astride = nb * static_cast<int64_t>(sizeof(BlockQ8));
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = w + (g0 * nb + i) * Q4_K_X8_BYTES;
        const uint8_t* c = w + (g1 * nb + i) * Q4_K_X8_BYTES;
        prefetch_block(b, Q4_K_X8_BYTES);
        if (c != b) prefetch_block(c, Q4_K_X8_BYTES);
        for (int j = 0; j < 4; ++j)
            for (int t = 0; t < 8; ++t) {
                const __m512i bits = W16::load(b + 128 + 256 * j + 32 * t, c + 128 + 256 * j + 32 * t);
                _mm512_store_si512(bt[2 * j] + 64 * t, _mm512_and_si512(bits, m4));
                _mm512_store_si512(bt[2 * j + 1] + 64 * t, _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4));
            }
        const __m512 d = W16::fp16(b, c), dm = W16::fp16(b + 16, c + 16);
        const __m512i p0 = W16::load(b + 32, c + 32), p1 = W16::load(b + 64, c + 64), p2 = W16::load(b + 96, c + 96);
        const __m512i sc03 = _mm512_and_si512(p0, lo6), mn03 = _mm512_and_si512(p1, lo6);
        const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(p2, lo4),
                                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(p0, 6), lo2), 4));
        const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(p2, 4), lo4),
                                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(p1, 6), lo2), 4));
        const int8_t* a = q8[0 * nb + i].qs;
        __m512i isum[kMaxRows], imin[kMaxRows];
        for (int r = 0; r < m; ++r) isum[r] = imin[r] = _mm512_setzero_si512();
        for (int half = 0; half < 2; ++half) {
            KQ_FOUR_SUBBLOCKS(a, astride, bt, 32, 4 * half);
            for (int jj = 0; jj < 2; ++jj) {  // sub-blocks 2 j, 2 j + 1 of j = 2 half + jj
                const int j = 2 * half + jj;
                const __m512i scs = j < 2 ? sc03 : sc47;
                const __m512i s_lo = byte_u32<W16>(scs, (2 * j) & 3), s_hi = byte_u32<W16>(scs, (2 * j + 1) & 3);
                const __m512i mins = W16::shuffle(j < 2 ? mn03 : mn47, kPick[1][(2 * j) & 3]);
                for (int r = 0; r < m; ++r) {
                    const __m512i lo = _mm512_mullo_epi32(ctile(ct[2 * jj][r]), s_lo);
                    const __m512i hi = _mm512_mullo_epi32(ctile(ct[2 * jj + 1][r]), s_hi);
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_add_epi32(lo, hi));
                    const __m512i bsums = W16::bcast4(q8[r * nb + i].bsums32 + 2 * j);
                    imin[r] = _mm512_add_epi32(imin[r], _mm512_madd_epi16(mins, bsums));
                }
            }
        }
        for (int r = 0; r < m; ++r) {
            const float da = q8[r * nb + i].d;
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, _mm512_set1_ps(da)), acc[r]);
            accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin[r]), _mm512_mul_ps(dm, _mm512_set1_ps(da)), accm[r]);
        }
    }
    for (int r = 0; r < m; ++r) W16::store(out + r * ldo + 8 * g0, _mm512_sub_ps(acc[r], accm[r]), g1 != g0);
}

// The same for Q6_K: 16 sub-blocks of 16 values, the codes 0..63 (their -32 as 32 * scale * (sum of a), as there).
KQ_AMX void q6k_amx(const BlockQ8* q8, int m, int64_t nb, const uint8_t* w, int64_t g0, int64_t g1, float* out,
                    int64_t ldo) {
    alignas(64) int8_t bt[16][4 * 64];
    alignas(64) int32_t ct[4][kMaxRows][16];
    const __m512i m2 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(15), m2b = _mm512_set1_epi8(12);
    const __m512i m2c = _mm512_set1_epi8(48), m2d = _mm512_set1_epi8(-64);
    __m512 acc[kMaxRows];
    for (int r = 0; r < m; ++r) acc[r] = _mm512_setzero_ps();
    const int64_t astride = nb * static_cast<int64_t>(sizeof(BlockQ8));
    for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = w + (g0 * nb + i) * Q6_K_X8_BYTES;
        const uint8_t* c = w + (g1 * nb + i) * Q6_K_X8_BYTES;
        prefetch_block(b, Q6_K_X8_BYTES);
        if (c != b) prefetch_block(c, Q6_K_X8_BYTES);
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 8; ++t) {  // sub-block 8 h + 2 k + t / 4, its row t % 4
                const int64_t v = 144 + 96 * (8 * h + t);
                const __m512i l0 = W16::load(b + v, c + v), l1 = W16::load(b + v + 32, c + v + 32);
                const __m512i hb = W16::load(b + v + 64, c + v + 64);
                const __m512i q[4] = {
                    _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_slli_epi16(_mm512_and_si512(hb, m2), 4)),
                    _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_slli_epi16(_mm512_and_si512(hb, m2b), 2)),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(hb, m2c)),
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                                    _mm512_srli_epi16(_mm512_and_si512(hb, m2d), 2))};
                for (int k = 0; k < 4; ++k) _mm512_store_si512(bt[8 * h + 2 * k + t / 4] + 64 * (t % 4), q[k]);
            }
        const __m512 d = W16::fp16(b, c);
        __m512i planes[4];
        for (int p = 0; p < 4; ++p) planes[p] = W16::load(b + 16 + 32 * p, c + 16 + 32 * p);
        const int8_t* a = q8[0 * nb + i].qs;
        __m512i isum[kMaxRows];
        for (int r = 0; r < m; ++r) {  // the codes' -32: 32 * sum over sub-blocks of scale * (sum of a)
            __m512i s = _mm512_setzero_si512();
            for (int k = 0; k < 8; ++k) {
                const __m512i pair = _mm512_srai_epi16(W16::shuffle(planes[k / 2], kPickSigned[1][(2 * k) % 4]), 8);
                s = _mm512_add_epi32(s, _mm512_madd_epi16(pair, W16::bcast4(q8[r * nb + i].bsums + 2 * k)));
            }
            isum[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 5));
        }
        for (int quarter = 0; quarter < 4; ++quarter) {  // sub-blocks 4 quarter .. 4 quarter + 3
            KQ_FOUR_SUBBLOCKS(a, astride, bt, 16, 4 * quarter);
            for (int k = 0; k < 4; ++k) {
                const int sub = 4 * quarter + k;
                const __m512i sc = byte_s32<W16>(planes[sub / 4], sub % 4);
                for (int r = 0; r < m; ++r)
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(ctile(ct[k][r]), sc));
            }
        }
        for (int r = 0; r < m; ++r)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, _mm512_set1_ps(q8[r * nb + i].d)),
                                     acc[r]);
    }
    for (int r = 0; r < m; ++r) W16::store(out + r * ldo + 8 * g0, acc[r], g1 != g0);
}

#undef KQ_FOUR_SUBBLOCKS

bool os_allows_tiles() {  // Linux asks each process to request the tile data state (arch_prctl, since 5.16)
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
#else
    return false;
#endif
}

}  // namespace

bool amx_supported() {
    static const bool ok = [] {
        unsigned eax, ebx, ecx, edx;
        __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
        const bool cpu = (edx >> 24 & 1) && (edx >> 25 & 1);  // AMX-TILE, AMX-INT8
        if (!cpu || !vnni_supported()) return false;
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        return (lo >> 17 & 3) == 3 && os_allows_tiles();  // XCR0: XTILECFG, XTILEDATA
    }();
    return ok;
}

KQ_AMX void gemm_rows_x8_amx(int ggml_type, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                             int64_t n1, float* out, int64_t ldo) {
    const bool q4 = ggml_type == GGML_Q4_K;
    for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
        const int rows = static_cast<int>(m - r0 < kMaxRows ? m - r0 : kMaxRows);
        // Loaded on every call: another kernel on this thread (ONNX Runtime's own) may have set its own tiles.
        configure(rows, q4 ? 32 : 16);
        for (int64_t g = n0 / 8; g < n1 / 8; g += 2) {
            const int64_t g1 = g + 1 < n1 / 8 ? g + 1 : g;
            (q4 ? q4k_amx : q6k_amx)(q8 + r0 * nb, rows, nb, w, g, g1, out + r0 * ldo, ldo);
        }
    }
    _tile_release();
}

}  // namespace kquant
#else  // no tile intrinsics in this compiler: the path is never chosen
namespace kquant {
bool amx_supported() { return false; }
void gemm_rows_x8_amx(int, const BlockQ8*, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, int64_t) {}
}  // namespace kquant
#endif  // KQ_HAVE_AMX
