// ONNX Runtime custom ops edge_spec::CacheAttention (float16 KV cache) and edge_spec::CacheAttentionF32 (float32
// KV cache), CPU: causal grouped-query attention over a KV cache written in place, with rotary embedding — the
// subset of com.microsoft::GroupQueryAttention a decoder graph of edge-spec's uses, with the same inputs, outputs
// and attributes, so a graph swaps one for the other node for node.
//
//   inputs:  0 query   float32 [B, S, H * d], or q, k and v packed [B, S, (H + 2 Hk) * d] when 1 and 2 are absent
//            1 key     float32 [B, S, Hk * d] (optional)       2 value  float32 [B, S, Hk * d] (optional)
//            3 past_key, 4 past_value  [B, Hk, C, d] (float16 for CacheAttention, float32 for CacheAttentionF32)
//            5 seqlens_k int32 [B]: batch b's valid length after this pass, minus 1 (so its past is
//              seqlens_k[b] + 1 - S positions)   6 total_sequence_length int32 [1] (unused beyond its type)
//            7 cos_cache, 8 sin_cache float32 [P, R / 2]: the rotary tables (rotate-half layout over the first R
//              dimensions of each head; the rest pass through)
//   outputs: 0 float32 [B, S, H * d]   1 present_key, 2 present_value [B, Hk, max(C, total), d], past's type;
//            bound to past's buffer (edge-spec's runtime does) they are updated in place, else past is copied in
//            first (a plain loop may feed exactly the past, C = its length, as GroupQueryAttention allows)
//   attrs:   num_heads H, kv_num_heads Hk (H a multiple of Hk), scale (default 1 / sqrt(d)), local_window_size
//            (-1: full attention; W: a query sees its last W keys, itself included), softcap (0: none; c: scores
//            become c * tanh(s / c))
//
// Row r of batch b sits at position p = past + r: its q and k are rotated at p, its k and v stored at row p of the
// cache (rounded to the cache's type), then it attends keys [max(0, p + 1 - W), p] of the cache. Each (b, r, head)
// output takes one fixed sequence of float operations that depends only on p and the cache's rows — never on S,
// on the other rows or on the thread count — so a row's output is the same whether the pass has 1 row or 9: a
// 1-token step needs no padding row for verify passes to reproduce it. The query heads sharing a KV head are
// computed together, each key and value row converted once for all of them.
#include <immintrin.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "attention.h"
#include "ort_helpers.h"

namespace {

constexpr int kMaxHeadDim = 512;

struct AttnOp : OrtCustomOp {
    bool half;  // float16 KV cache
    const char* name;
};

struct AttnKernel {
    bool half;
    int64_t heads, kv_heads, window;
    float scale;  // <= 0: 1 / sqrt(d)
    float softcap;
};

using edge_spec_ort::api;
using edge_spec_ort::dims_of;
using edge_spec_ort::fail;

template <typename T>
T* data_of(const OrtValue* v) {
    void* p = nullptr;
    OrtStatus* st = api()->GetTensorMutableData(const_cast<OrtValue*>(v), &p);
    if (st != nullptr) {
        api()->ReleaseStatus(st);
        return nullptr;
    }
    return static_cast<T*>(p);
}

// e^x for 8 floats (Cephes' expf: x = n ln 2 + r, a degree-5 polynomial in r, times 2^n); inputs below -87 give 0.
inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(n)));
}

inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Row ``j`` of a cache head as float32 into ``out`` [d].
inline void load_row(const void* cache, bool half, int64_t j, int64_t d, float* out) {
    if (half) {
        const uint16_t* src = static_cast<const uint16_t*>(cache) + j * d;
        for (int64_t c = 0; c < d; c += 8)
            _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c))));
    } else {
        std::memcpy(out, static_cast<const float*>(cache) + j * d, static_cast<size_t>(d) * sizeof(float));
    }
}

// x [d] rotated at table row ``cos`` / ``sin`` [half] (rotate-half over the first 2 * half dimensions), into out.
inline void rotate(const float* x, const float* cos, const float* sin, int64_t half, int64_t d, float* out) {
    for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        out[i] = a * cos[i] - b * sin[i];
        out[i + half] = b * cos[i] + a * sin[i];
    }
    for (int64_t i = 2 * half; i < d; ++i) out[i] = x[i];
}

struct Pass {
    const AttnKernel* k;
    int64_t batch, rows, d, group, cap, half_rot;
    const float *q, *kin, *vin;  // row stride q_stride / kv_stride; head h of row (b, r) at + h * d
    int64_t q_stride, kv_stride;
    void *kcache, *vcache;  // [B, Hk, C, d]
    const int32_t* seqlens;
    const float *cos, *sin;
    float* out;  // [B, S, H * d]
};

inline int64_t past_of(const Pass& p, int64_t b) { return static_cast<int64_t>(p.seqlens[b]) + 1 - p.rows; }

// Task (b, r, g): k and v of row r, KV head g, rotated / rounded into the cache at position past + r.
void store_task(void* data, size_t index) {
    const Pass& p = *static_cast<const Pass*>(data);
    const int64_t hk = p.k->kv_heads;
    const int64_t g = static_cast<int64_t>(index) % hk, br = static_cast<int64_t>(index) / hk;
    const int64_t b = br / p.rows, r = br % p.rows, pos = past_of(p, b) + r;
    const float* krow = p.kin + (b * p.rows + r) * p.kv_stride + g * p.d;
    const float* vrow = p.vin + (b * p.rows + r) * p.kv_stride + g * p.d;
    alignas(32) float kr[kMaxHeadDim];
    rotate(krow, p.cos + pos * p.half_rot, p.sin + pos * p.half_rot, p.half_rot, p.d, kr);
    const int64_t at = ((b * hk + g) * p.cap + pos) * p.d;
    if (p.k->half) {
        uint16_t* kc = static_cast<uint16_t*>(p.kcache) + at;
        uint16_t* vc = static_cast<uint16_t*>(p.vcache) + at;
        for (int64_t c = 0; c < p.d; c += 8) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(kc + c), _mm256_cvtps_ph(_mm256_loadu_ps(kr + c), 0));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(vc + c), _mm256_cvtps_ph(_mm256_loadu_ps(vrow + c), 0));
        }
    } else {
        std::memcpy(static_cast<float*>(p.kcache) + at, kr, static_cast<size_t>(p.d) * sizeof(float));
        std::memcpy(static_cast<float*>(p.vcache) + at, vrow, static_cast<size_t>(p.d) * sizeof(float));
    }
}

// q . row for N query heads q + h * d (N <= 4), two accumulators a head: independent FMA chains, one key row load
// shared by the heads. The order of the float operations depends on d alone.
template <int N>
inline void dots(const float* q, int64_t d, const float* row, float scale, float* out) {
    __m256 a[N][2];
    for (int h = 0; h < N; ++h) a[h][0] = a[h][1] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        const __m256 k0 = _mm256_load_ps(row + c), k1 = _mm256_load_ps(row + c + 8);
        for (int h = 0; h < N; ++h) {
            a[h][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + c), k0, a[h][0]);
            a[h][1] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + c + 8), k1, a[h][1]);
        }
    }
    if (c < d) {  // d = 16 m + 8
        const __m256 k0 = _mm256_load_ps(row + c);
        for (int h = 0; h < N; ++h) a[h][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + c), k0, a[h][0]);
    }
    for (int h = 0; h < N; ++h) out[h] = hsum8(_mm256_add_ps(a[h][0], a[h][1])) * scale;
}

constexpr int kKeyBlock = 4;  // value rows weighed per load / store of an output accumulator

// Task (b, r, g): the outputs of the query heads g * group .. (g + 1) * group - 1 of row r.
void attend_task(void* data, size_t index) {
    const Pass& p = *static_cast<const Pass*>(data);
    const AttnKernel& k = *p.k;
    const int64_t hk = k.kv_heads, d = p.d, G = p.group;
    const int64_t g = static_cast<int64_t>(index) % hk, br = static_cast<int64_t>(index) / hk;
    const int64_t b = br / p.rows, r = br % p.rows, pos = past_of(p, b) + r;
    const int64_t end = pos + 1, start = k.window > 0 && end > k.window ? end - k.window : 0, n = end - start;
    const int64_t padded = (n + 7) / 8 * 8;
    const float scale = k.scale > 0 ? k.scale : 1.0f / std::sqrt(static_cast<float>(d));

    thread_local std::vector<float> qs, scores, acc;
    qs.resize(static_cast<size_t>(G * d));
    scores.resize(static_cast<size_t>(G * padded));
    acc.assign(static_cast<size_t>(G * d), 0.0f);
    const float* qrow = p.q + (b * p.rows + r) * p.q_stride;
    for (int64_t h = 0; h < G; ++h)
        rotate(qrow + (g * G + h) * d, p.cos + pos * p.half_rot, p.sin + pos * p.half_rot, p.half_rot, d,
               qs.data() + h * d);

    const size_t elem = k.half ? 2 : 4;
    const char* kc = static_cast<const char*>(p.kcache) + static_cast<size_t>((b * hk + g) * p.cap * d) * elem;
    const char* vc = static_cast<const char*>(p.vcache) + static_cast<size_t>((b * hk + g) * p.cap * d) * elem;
    alignas(32) float row[kKeyBlock][kMaxHeadDim];
    for (int64_t j = 0; j < n; ++j) {  // scores: q . k, one key row converted for the whole group
        load_row(kc, k.half, start + j, d, row[0]);
        float s4[4];
        for (int64_t h0 = 0; h0 < G; h0 += 4) {
            const float* qh = qs.data() + h0 * d;
            switch (G - h0 < 4 ? G - h0 : 4) {
                case 1: dots<1>(qh, d, row[0], scale, s4); break;
                case 2: dots<2>(qh, d, row[0], scale, s4); break;
                case 3: dots<3>(qh, d, row[0], scale, s4); break;
                default: dots<4>(qh, d, row[0], scale, s4); break;
            }
            for (int64_t h = h0; h < G && h < h0 + 4; ++h) {
                float v = s4[h - h0];
                if (k.softcap > 0) v = k.softcap * std::tanh(v / k.softcap);
                scores[h * padded + j] = v;
            }
        }
    }
    thread_local std::vector<float> inv;
    inv.resize(static_cast<size_t>(G));
    for (int64_t h = 0; h < G; ++h) {  // softmax numerators and their sum, 8 lanes then one fixed reduction
        float* sh = scores.data() + h * padded;
        float m = sh[0];
        for (int64_t j = 1; j < n; ++j) m = sh[j] > m ? sh[j] : m;
        for (int64_t j = n; j < padded; ++j) sh[j] = -INFINITY;  // exp8 -> 0: the sum is unchanged
        const __m256 mv = _mm256_set1_ps(m);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j = 0; j < padded; j += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + j), mv));
            _mm256_storeu_ps(sh + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        inv[h] = 1.0f / hsum8(sum);
    }
    for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {  // weighted values: value rows converted once for the group,
        const int64_t m = n - j0 < kKeyBlock ? n - j0 : kKeyBlock;  // each accumulator loaded once per block
        for (int64_t t = 0; t < m; ++t) load_row(vc, k.half, start + j0 + t, d, row[t]);
        for (int64_t h = 0; h < G; ++h) {
            __m256 w[kKeyBlock];
            for (int64_t t = 0; t < m; ++t) w[t] = _mm256_set1_ps(scores[h * padded + j0 + t]);
            float* ah = acc.data() + h * d;
            for (int64_t c = 0; c < d; c += 8) {
                __m256 x = _mm256_loadu_ps(ah + c);
                for (int64_t t = 0; t < m; ++t) x = _mm256_fmadd_ps(w[t], _mm256_load_ps(row[t] + c), x);
                _mm256_storeu_ps(ah + c, x);
            }
        }
    }
    float* orow = p.out + (b * p.rows + r) * k.heads * d + g * G * d;
    for (int64_t h = 0; h < G; ++h) {
        const __m256 s = _mm256_set1_ps(inv[h]);
        for (int64_t c = 0; c < d; c += 8)
            _mm256_storeu_ps(orow + h * d + c, _mm256_mul_ps(_mm256_loadu_ps(acc.data() + h * d + c), s));
    }
}

OrtStatus* compute(const AttnKernel& k, OrtKernelContext* ctx) {
    const OrtValue* in[9] = {};
    for (size_t i = 0; i < 9; ++i) ORT_TRY(api()->KernelContext_GetInput(ctx, i, &in[i]));
    const char* who = k.half ? "CacheAttention" : "CacheAttentionF32";
    for (size_t i : {0, 3, 4, 5, 6, 7, 8})
        if (in[i] == nullptr) return fail(std::string(who) + ": input " + std::to_string(i) + " is required");
    if ((in[1] == nullptr) != (in[2] == nullptr))
        return fail(std::string(who) + ": key and value are given together or both left out (packed query)");
    std::vector<int64_t> qd, pd, sd, cd;
    ORT_TRY(dims_of(in[0], qd));
    ORT_TRY(dims_of(in[3], pd));
    ORT_TRY(dims_of(in[5], sd));
    ORT_TRY(dims_of(in[7], cd));
    if (qd.size() != 3 || pd.size() != 4 || cd.size() != 2)
        return fail(std::string(who) + ": query must be [B, S, width], past_key [B, kv_heads, capacity, head_size] "
                    "and cos_cache [positions, rotary / 2]");
    const int64_t B = qd[0], S = qd[1], d = pd[3], cap = pd[2], H = k.heads, hk = k.kv_heads;
    const bool packed = in[1] == nullptr;
    const int64_t q_stride = qd[2], want = packed ? (H + 2 * hk) * d : H * d;
    if (pd[0] != B || pd[1] != hk || d % 8 != 0 || d > kMaxHeadDim)
        return fail(std::string(who) + ": past_key is [" + std::to_string(pd[0]) + ", " + std::to_string(pd[1]) +
                    ", _, " + std::to_string(d) + "]; it must be [B, kv_num_heads, capacity, head_size] with "
                    "head_size a multiple of 8 up to 512");
    if (q_stride != want)
        return fail(std::string(who) + ": query has width " + std::to_string(q_stride) + "; num_heads " +
                    std::to_string(H) + ", kv_num_heads " + std::to_string(hk) + " and head_size " +
                    std::to_string(d) + " need " + std::to_string(want));
    if (sd.size() != 1 || sd[0] != B) return fail(std::string(who) + ": seqlens_k must be int32 [B]");
    const int64_t half_rot = cd[1];
    if (2 * half_rot > d) return fail(std::string(who) + ": the rotary tables are wider than half a head");
    std::vector<int64_t> td;
    ORT_TRY(dims_of(in[6], td));
    const int32_t* total = data_of<int32_t>(in[6]);
    // present holds max(capacity, total) positions: past's buffer itself when bound to it (edge-spec's runtime),
    // else a new one past is copied into (a plain loop feeding exactly the past, as GroupQueryAttention allows)
    const int64_t plen = td.size() <= 1 && total != nullptr && total[0] > cap ? total[0] : cap;
    const int32_t* seqlens = data_of<int32_t>(in[5]);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t past = static_cast<int64_t>(seqlens[b]) + 1 - S;
        if (past < 0 || past + S > plen || past + S > cd[0])
            return fail(std::string(who) + ": batch " + std::to_string(b) + " has " + std::to_string(past) +
                        " past positions and " + std::to_string(S) + " new rows; the cache holds " +
                        std::to_string(plen) + " and the rotary tables " + std::to_string(cd[0]));
    }
    std::vector<int64_t> od = {B, S, H * d}, kd = {B, hk, plen, d};
    OrtValue* out[3] = {};
    ORT_TRY(api()->KernelContext_GetOutput(ctx, 0, od.data(), od.size(), &out[0]));
    for (size_t i = 1; i < 3; ++i) ORT_TRY(api()->KernelContext_GetOutput(ctx, i, kd.data(), kd.size(), &out[i]));
    const size_t elem = k.half ? 2 : 4, head_bytes = static_cast<size_t>(cap * d) * elem;
    for (size_t i = 1; i < 3; ++i) {  // present not bound to past's buffer: past first, then the new rows
        char* dst = data_of<char>(out[i]);
        const char* src = data_of<char>(in[i + 2]);
        if (dst == src || head_bytes == 0) continue;
        for (int64_t bg = 0; bg < B * hk; ++bg)
            std::memcpy(dst + static_cast<size_t>(bg * plen * d) * elem, src + bg * head_bytes, head_bytes);
    }
    if (B == 0 || S == 0) return nullptr;
    const float* q = data_of<float>(in[0]);
    Pass p{&k, B, S, d, H / hk, plen, half_rot, q, packed ? q + H * d : data_of<float>(in[1]),
           packed ? q + (H + hk) * d : data_of<float>(in[2]), q_stride, packed ? q_stride : hk * d,
           data_of<void>(out[1]), data_of<void>(out[2]), seqlens, data_of<float>(in[7]), data_of<float>(in[8]),
           data_of<float>(out[0])};
    const size_t tasks = static_cast<size_t>(B * S * hk);
    ORT_TRY(api()->KernelContext_ParallelFor(ctx, store_task, tasks, 0, &p));
    return api()->KernelContext_ParallelFor(ctx, attend_task, tasks, 0, &p);
}

// ------------------------------------------------------------------------------------------------ OrtCustomOp
const AttnOp& op_of(const OrtCustomOp* op) { return *static_cast<const AttnOp*>(op); }

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                      void** kernel) {
    const AttnOp& o = op_of(op);
    int64_t heads = 0, kv_heads = 0, window = -1;
    float scale = 0.0f, softcap = 0.0f;
    ORT_TRY(api->KernelInfoGetAttribute_int64(info, "num_heads", &heads));
    ORT_TRY(api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &kv_heads));
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, "local_window_size", &window)) api->ReleaseStatus(st);
    if (OrtStatus* st = api->KernelInfoGetAttribute_float(info, "scale", &scale)) api->ReleaseStatus(st);
    if (OrtStatus* st = api->KernelInfoGetAttribute_float(info, "softcap", &softcap)) api->ReleaseStatus(st);
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
        return api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(o.name) + ": num_heads " + std::to_string(heads) +
                                                        " must be a positive multiple of kv_num_heads " +
                                                        std::to_string(kv_heads)).c_str());
    *kernel = new (std::nothrow) AttnKernel{o.half, heads, kv_heads, window, scale, softcap};
    return *kernel ? nullptr : api->CreateStatus(ORT_FAIL, (std::string(o.name) + ": out of memory").c_str());
}

OrtStatus* ORT_API_CALL compute_kernel(void* kernel, OrtKernelContext* ctx) {
    return compute(*static_cast<const AttnKernel*>(kernel), ctx);
}

void ORT_API_CALL destroy(void* kernel) { delete static_cast<AttnKernel*>(kernel); }
const char* ORT_API_CALL op_name(const OrtCustomOp* op) { return op_of(op).name; }
ONNXTensorElementDataType ORT_API_CALL in_type(const OrtCustomOp* op, size_t i) {
    if (i == 3 || i == 4)
        return op_of(op).half ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    return i == 5 || i == 6 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
size_t ORT_API_CALL in_count(const OrtCustomOp*) { return 9; }
ONNXTensorElementDataType ORT_API_CALL out_type(const OrtCustomOp* op, size_t i) {
    return i > 0 && op_of(op).half ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
size_t ORT_API_CALL out_count(const OrtCustomOp*) { return 3; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL in_char(const OrtCustomOp*, size_t i) {
    return i == 1 || i == 2 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL out_char(const OrtCustomOp*, size_t) {
    return INPUT_OUTPUT_REQUIRED;
}
AttnOp make(bool half, const char* name) {
    AttnOp op;
    edge_spec_ort::init_op(op, 17);
    op.half = half;
    op.name = name;
    op.GetName = op_name;
    op.GetInputType = in_type;
    op.GetInputTypeCount = in_count;
    op.GetOutputType = out_type;
    op.GetOutputTypeCount = out_count;
    op.KernelDestroy = destroy;
    op.GetInputCharacteristic = in_char;
    op.GetOutputCharacteristic = out_char;
    op.CreateKernelV2 = create_kernel;
    op.KernelComputeV2 = compute_kernel;
    return op;
}

AttnOp g_half = make(true, "CacheAttention");
AttnOp g_f32 = make(false, "CacheAttentionF32");

}  // namespace

namespace edge_spec_attention {

OrtStatus* add_ops(const OrtApi* ort, OrtCustomOpDomain* domain) {
    ORT_TRY(ort->CustomOpDomain_Add(domain, &g_half));
    return ort->CustomOpDomain_Add(domain, &g_f32);
}

}  // namespace edge_spec_attention
