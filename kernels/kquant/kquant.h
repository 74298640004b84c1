// GGUF K-quant matrix products on AVX2: y = A @ W^T with W the file's own Q4_K / Q6_K super-blocks.
//
// A's rows are first quantized to Q8_K-like blocks (256 int8 values, one fp32 scale, sums per 16), as llama.cpp's
// CPU backend does; the products are then integer (maddubs / madd) within a super-block and fp32 across them.
// Each output element is computed by one fixed sequence of operations whatever the number of rows M and however
// the rows of W are split among threads, so an M-row call equals M one-row calls bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kquant {

constexpr int QK = 256;            // values in a super-block
constexpr int GGML_Q4_K = 12;      // ggml_type ids (the GGUF file's tensor types)
constexpr int GGML_Q6_K = 14;
constexpr int Q4_K_BYTES = 144;    // fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
constexpr int Q6_K_BYTES = 210;    // 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, fp16 d

// One activation super-block: x ~= d * qs; bsums[j] = sum of qs[16 j .. 16 j + 15], bsums32 over 32.
struct BlockQ8 {
    float d;
    int8_t qs[QK];
    int16_t bsums[QK / 16];
    int16_t bsums32[QK / 32];
};

// A decode step streams every weight from memory once: the kernels ask for the super-block this many ahead of the
// one they compute (measured on the 1.5B coder target, AVX-512 machine, 2 threads: a 1-row pass 13 % faster at 2,
// none better at 1 or 4; BENCHMARKS.md "AVX-512 VNNI"). A prefetch never faults, past the tensor's end included.
constexpr int kPrefetchBlocks = 2;

inline void prefetch_block(const uint8_t* block, int bytes) {
    for (int l = 0; l < bytes; l += 64) __builtin_prefetch(block + kPrefetchBlocks * bytes + l, 0, 3);
}

// Q4_K rows interleaved by 8 (``interleave = 8``): the same bytes as the file's, reordered so that one 256-bit
// load holds 4 codes of each of 8 rows. For rows 8g..8g+7 and super-block i, at (g * nb + i) * 1152 bytes:
//   16 bytes: the 8 rows' fp16 d;  16 bytes: their fp16 dmin;
//   96 bytes: the 12 scale bytes of each row as three 32-bit words, word w of rows 0..7 at 32 w + 4 r;
//   1024 bytes: for j = 0..3, t = 0..7, r = 0..7: the file's qs[32 j + 4 t .. 32 j + 4 t + 3] of row r,
//               at 256 j + 32 t + 4 r (low nibbles: sub-block 2j, high nibbles: sub-block 2j + 1).
constexpr int Q4_K_X8_BYTES = 8 * Q4_K_BYTES;

// Q6_K rows interleaved by 8: for rows 8g..8g+7 and super-block i, at (g * nb + i) * 1680 bytes:
//   16 bytes: the 8 rows' fp16 d;  128 bytes: the 16 int8 scales of each row as four 32-bit words, word w of
//   row r at 32 w + 4 r;  then, in the order the kernel reads them, for h = 0..1, t = 0..7 (96 bytes each, at
//   144 + 96 (8 h + t)): for r = 0..7 the file's ql[64 h + 4 t .. + 3], then ql[64 h + 32 + 4 t .. + 3], then
//   qh[32 h + 4 t .. + 3] of row r (32 bytes each, row r at 4 r).
constexpr int Q6_K_X8_BYTES = 8 * Q6_K_BYTES;

// ------------------------------------------------------------------------------------------------ 32-value blocks
// Q8_0 and Q5_0, ggml's blocks of 32 (the types a Q4_K_M file stores where a row is not a multiple of 256, as in
// Qwen2.5-0.5B's 896 columns, and the whole of a Q8_0 file): kquant_q32.cpp, interleaved layouts only.
constexpr int QK32 = 32;
constexpr int GGML_Q4_1 = 3;
constexpr int GGML_Q5_0 = 6;
constexpr int GGML_Q8_0 = 8;
constexpr int Q5_0_BYTES = 22;  // fp16 d, qh[4] (bit j = the 5th bit of value j), qs[16] (j < 16: low nibble
                                // of qs[j]; j >= 16: high nibble of qs[j - 16]); w = d * (q - 16)
constexpr int Q8_0_BYTES = 34;  // fp16 d, int8 qs[32]; w = d * q
constexpr int Q4_1_BYTES = 20;  // fp16 d, fp16 m, qs[16] (nibbles as Q5_0's); w = d * q + m

// One activation block of 32: x ~= d * qs, sum = the sum of qs (40 bytes).
struct BlockQ32 {
    float d;
    int32_t sum;
    int8_t qs[QK32];
};

// Q8_0 rows interleaved by 8: for rows 8g..8g+7 and block i, at (g * nb + i) * 272 bytes: 16 bytes: the 8 rows'
// fp16 d; 256 bytes: for t = 0..7, r = 0..7 the file's qs[4 t .. 4 t + 3] of row r at 32 t + 4 r.
constexpr int Q8_0_X8_BYTES = 8 * Q8_0_BYTES;
// Q5_0 rows interleaved by 8: at (g * nb + i) * 176 bytes: 16 bytes: the 8 rows' fp16 d; 32 bytes: the rows' qh
// bits regrouped by chunk, for c = 0..7 a 32-bit word at 4 c whose bits 4 r .. 4 r + 3 are bits 4 c .. 4 c + 3 of
// row r's qh (the 5th bits of values 4 c .. 4 c + 3 of the 8 rows: the mask of the bytes the kernels set);
// 128 bytes: for t = 0..3, r = 0..7 the file's qs[4 t .. 4 t + 3] of row r at 32 t + 4 r (low nibbles: values
// 4 t .. 4 t + 3, high nibbles: values 16 + 4 t ..). The same bits as the file's, moved.
constexpr int Q5_0_X8_BYTES = 8 * Q5_0_BYTES;
// Q4_1 rows interleaved by 8: at (g * nb + i) * 160 bytes: 16 bytes: the 8 rows' fp16 d; 16 bytes: their fp16 m;
// 128 bytes: the codes as Q5_0_X8's (for t = 0..3, r = 0..7 the file's qs[4 t .. 4 t + 3] of row r at 32 t + 4 r).
constexpr int Q4_1_X8_BYTES = 8 * Q4_1_BYTES;

// Values per weight block of ``ggml_type``: 256 for the K-quants, 32 for Q8_0 / Q5_0 / Q4_1 (0 if not supported).
int block_values(int ggml_type);

// x [K] (K a multiple of 32) -> K / 32 blocks: d = 1 / (127 / max |x|), codes round(x * 127 / max |x|) to
// nearest even; an all-zero block is d = 0, codes 0.
void quantize_row_q32(const float* x, BlockQ32* y, int64_t k);

// out[r * ldo + n] = dot(row r of the quantized activations, row n of W), n in [n0, n1) (multiples of 8), for a
// Q8_0 / Q5_0 / Q4_1 W interleaved by 8; q: m rows of nb = K / 32 blocks. Per block, the integer dot product of
// the codes, then acc = fma(float(isum), d_w * d_a, acc) (Q4_1: then acc = fma(m_w, d_a * sum_a, acc)): one fixed
// sequence per output whatever m and the split.
void gemm32_x8(int ggml_type, const BlockQ32* q, int64_t m, int64_t nb, const uint8_t* w, int64_t n0, int64_t n1,
               float* out, int64_t ldo);
// The same on AVX-512 VNNI (kquant_q32_vnni.cpp), bit for bit; gemm32_x8 calls it where x8_isa() says so.
void gemm32_x8_vnni(int ggml_type, const BlockQ32* q, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                    int64_t n1, float* out, int64_t ldo);

// Bytes of one weight block of ``ggml_type`` (0 if the type is not supported).
int block_bytes(int ggml_type);

// x [K] -> K / 256 blocks, the same numbers as llama.cpp's quantize_row_q8_K (round to nearest even).
void quantize_row_q8(const float* x, BlockQ8* y, int64_t k);

// out[r * ldo + n] = dot(row r of the quantized activations, row n of W) for n in [n0, n1), r in [0, m).
// q8: m rows of nb blocks each (row r at q8 + r * nb); w: the tensor's bytes, row n at w + n * row_bytes.
void gemm_rows(int ggml_type, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t row_bytes,
               int64_t n0, int64_t n1, float* out, int64_t ldo);

// As gemm_rows for rows interleaved by 8 (n0, n1 and N multiples of 8); w is the whole tensor.
void gemm_rows_x8(int ggml_type, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                  int64_t n1, float* out, int64_t ldo);

// gemm_rows_x8 on AVX-512 VNNI (kquant_vnni.cpp: vpdpbusd; 256-bit vectors below 5 rows, 512-bit from 5): the
// same outputs bit for bit; only for a CPU where ``vnni_supported()``. gemm_rows_x8 calls it by itself where
// ``x8_isa()`` says "avx512vnni".
void gemm_rows_x8_vnni(int ggml_type, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                       int64_t n1, float* out, int64_t ldo);
bool vnni_supported();
// gemm_rows_x8 on AMX tiles for passes of several rows (kquant_amx.cpp: tdpbssd per sub-block, the VNNI kernels'
// integers and float operations, so their outputs bit for bit); only where ``amx_supported()``.
void gemm_rows_x8_amx(int ggml_type, const BlockQ8* q8, int64_t m, int64_t nb, const uint8_t* w, int64_t n0,
                      int64_t n1, float* out, int64_t ldo);
// AMX-TILE + AMX-INT8 + AVX-512 VNNI, the tile state enabled by the OS and granted to this process (Linux:
// arch_prctl ARCH_REQ_XCOMP_PERM, asked once).
bool amx_supported();
// The instruction set gemm_rows_x8 uses: "amx" where amx_supported() (AMX tiles for passes of kAmxFromRows rows or
// more, VNNI below), else "avx512vnni" where the CPU has AVX512VL + AVX512VNNI, else "avx2";
// EDGE_SPEC_KQUANT_ISA=avx512vnni or =avx2 in the environment (read once) keeps it on that one.
const char* x8_isa();
constexpr int64_t kAmxFromRows = 8;

// Dequantization (the embedding's GgufGather): y[0 .. nb * 256) = row ``n`` of W in fp32, the same numbers as
// ggml's dequantize_row_q4_K / _q6_K and gguf-py's gguf.quants.dequantize, bit for bit (their operation order:
// Q4_K (d * sc) * q - (dmin * m), Q6_K (d * sc) * q; scalar code, built with -ffp-contract=off).
// w: the whole tensor, rows in the file's order (row n at w + n * nb * block_bytes) ...
void dequantize_row(int ggml_type, const uint8_t* w, int64_t nb, int64_t n, float* y);
// ... or interleaved by 8 (the layouts above; N a multiple of 8).
void dequantize_row_x8(int ggml_type, const uint8_t* w, int64_t nb, int64_t n, float* y);

}  // namespace kquant
