// Byte-shuffle masks the interleaved kernels share (kquant.cpp's AVX2, kquant_vnni.cpp's AVX-512 VNNI): for a
// 32-bit lane r holding 4 bytes (one per sub-block), the int16 lanes (2r, 2r + 1) of the shuffled result are
//   kPick[0][k]: bytes (k, k), kPick[1][k]: bytes (k, k + 1) (k = 3: (3, 3)), zero-extended;
//   kPickSigned[0][k] / [1][k]: the same bytes in the high half of each int16 (>> 8 sign-extends them).
// Both 16-byte halves of each mask are equal (a 512-bit kernel broadcasts the first to all four lanes).
#pragma once

#include <cstdint>

namespace kquant {

alignas(32) inline constexpr int8_t kPick[2][4][32] = {
#define KQ_M(a, b) a, -128, b, -128, a + 4, -128, b + 4, -128, a + 8, -128, b + 8, -128, a + 12, -128, b + 12, -128
    {{KQ_M(0, 0), KQ_M(0, 0)}, {KQ_M(1, 1), KQ_M(1, 1)}, {KQ_M(2, 2), KQ_M(2, 2)}, {KQ_M(3, 3), KQ_M(3, 3)}},
    {{KQ_M(0, 1), KQ_M(0, 1)}, {KQ_M(1, 2), KQ_M(1, 2)}, {KQ_M(2, 3), KQ_M(2, 3)}, {KQ_M(3, 3), KQ_M(3, 3)}},
#undef KQ_M
};

alignas(32) inline constexpr int8_t kPickSigned[2][4][32] = {
#define KQ_S(a, b) -128, a, -128, b, -128, a + 4, -128, b + 4, -128, a + 8, -128, b + 8, -128, a + 12, -128, b + 12
    {{KQ_S(0, 0), KQ_S(0, 0)}, {KQ_S(1, 1), KQ_S(1, 1)}, {KQ_S(2, 2), KQ_S(2, 2)}, {KQ_S(3, 3), KQ_S(3, 3)}},
    {{KQ_S(0, 1), KQ_S(0, 1)}, {KQ_S(1, 2), KQ_S(1, 2)}, {KQ_S(2, 3), KQ_S(2, 3)}, {KQ_S(3, 3), KQ_S(3, 3)}},
#undef KQ_S
};

}  // namespace kquant
