// ONNX Runtime custom ops edge_spec::GgufMatMul and edge_spec::GgufGather (CPU), registered by RegisterCustomOps
// when the library is loaded with SessionOptions.register_custom_ops_library(path) (with them: the attention ops of
// attention.cpp).
//
// GgufMatMul
//   inputs:  A float32 [..., K];  B uint8 [N, K / 256 * block_bytes]: the GGUF tensor's rows of super-blocks as
//            stored in the file (Q4_K: 144 bytes per 256 values, Q6_K: 210)
//   attr:    ggml_type (int): 12 = Q4_K, 14 = Q6_K; 8 = Q8_0, 6 = Q5_0, 3 = Q4_1 (blocks of 32, interleave 8 only)
//            interleave (int, optional): 0 = the file's row order (default), 8 = rows interleaved by 8
//            (kquant.h: the same bytes reordered; N a multiple of 8)
//   output:  Y float32 [..., N] = A @ W^T, W the dequantized tensor (A's rows quantized to int8 per 256 first;
//            per 32 for Q8_0 / Q5_0 / Q4_1)
// GgufGather (an embedding lookup; the data first, as ONNX Gather)
//   inputs:  B uint8 [N, row_bytes] as GgufMatMul's B (same attributes);  ids int64 [...], each in [0, N)
//   output:  float32 [..., K], K = row_bytes / block_bytes * 256: rows ids of W dequantized exactly as ggml's
//            dequantize_row_q4_K / _q6_K (and gguf-py) compute them
//
// Only the C API is used (onnxruntime_c_api.h, API version kApiVersion: any ONNX Runtime >= 1.17 serves it).
#include <climits>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "attention.h"
#include "kquant.h"
#include "ort_helpers.h"
#include "onnxruntime_c_api.h"

namespace {

constexpr uint32_t kApiVersion = 17;  // KernelContext_ParallelFor arrived in 1.17
constexpr int64_t kRowsPerTask = 32;  // rows of W per parallel task
const OrtApi* g_api = nullptr;

enum class OpKind { kMatMul, kGather };

// An OrtCustomOp with the op's identity (ONNX Runtime hands the registered pointer back to the callbacks).
struct Op : OrtCustomOp {
    OpKind kind;
    const char* name;
};

const Op& op_of(const OrtCustomOp* op) { return *static_cast<const Op*>(op); }

struct Kernel {
    OpKind kind;
    int ggml_type;
    int interleave;
};

struct Task {
    int ggml_type;
    int interleave;
    const kquant::BlockQ8* q8;    // K-quants: activations per 256
    const kquant::BlockQ32* q32;  // Q8_0 / Q5_0 / Q4_1: activations per 32
    int64_t m, nb, n;
    const uint8_t* w;
    int64_t row_bytes;
    float* y;
};

void run_task(void* data, size_t index) {
    const Task& t = *static_cast<const Task*>(data);
    const int64_t n0 = static_cast<int64_t>(index) * kRowsPerTask;
    const int64_t n1 = n0 + kRowsPerTask < t.n ? n0 + kRowsPerTask : t.n;
    if (t.q32 != nullptr)
        kquant::gemm32_x8(t.ggml_type, t.q32, t.m, t.nb, t.w, n0, n1, t.y, t.n);
    else if (t.interleave == 8)
        kquant::gemm_rows_x8(t.ggml_type, t.q8, t.m, t.nb, t.w, n0, n1, t.y, t.n);
    else
        kquant::gemm_rows(t.ggml_type, t.q8, t.m, t.nb, t.w, t.row_bytes, n0, n1, t.y, t.n);
}

using edge_spec_ort::dims_of;
using edge_spec_ort::fail;

// Input ``i`` of the kernel call and its shape.
OrtStatus* input(OrtKernelContext* ctx, size_t i, const OrtValue** value, std::vector<int64_t>& dims) {
    ORT_TRY(g_api->KernelContext_GetInput(ctx, i, value));
    return dims_of(*value, dims);
}

OrtStatus* compute_matmul(const Kernel& k, OrtKernelContext* ctx) {
    const OrtValue* a_val = nullptr;
    const OrtValue* b_val = nullptr;
    std::vector<int64_t> ad, bd;
    ORT_TRY(input(ctx, 0, &a_val, ad));
    ORT_TRY(input(ctx, 1, &b_val, bd));
    if (ad.empty()) return fail("GgufMatMul: A must have at least one dimension [..., K]");
    if (bd.size() != 2) return fail("GgufMatMul: B must be uint8 [N, bytes per row], the GGUF tensor's rows");
    const int64_t kdim = ad.back(), n = bd[0], row_bytes = bd[1];
    const int bb = kquant::block_bytes(k.ggml_type), qk = kquant::block_values(k.ggml_type);
    if (kdim % qk != 0)
        return fail("GgufMatMul: K = " + std::to_string(kdim) + " is not a multiple of " + std::to_string(qk) +
                    " (the block of ggml_type " + std::to_string(k.ggml_type) + ")");
    const int64_t nb = kdim / qk;
    if (row_bytes != nb * bb)
        return fail("GgufMatMul: B has " + std::to_string(row_bytes) + " bytes per row; K = " + std::to_string(kdim) +
                    " needs " + std::to_string(nb * bb) + " for ggml_type " + std::to_string(k.ggml_type));
    if (k.interleave == 8 && n % 8 != 0)
        return fail("GgufMatMul: interleave = 8 needs N a multiple of 8, not " + std::to_string(n));
    int64_t m = 1;
    for (size_t i = 0; i + 1 < ad.size(); ++i) m *= ad[i];

    std::vector<int64_t> yd(ad.begin(), ad.end());
    yd.back() = n;
    OrtValue* y_val = nullptr;
    ORT_TRY(g_api->KernelContext_GetOutput(ctx, 0, yd.data(), yd.size(), &y_val));
    void* a_ptr = nullptr;
    void* b_ptr = nullptr;
    void* y_ptr = nullptr;
    ORT_TRY(g_api->GetTensorMutableData(const_cast<OrtValue*>(a_val), &a_ptr));
    ORT_TRY(g_api->GetTensorMutableData(const_cast<OrtValue*>(b_val), &b_ptr));
    ORT_TRY(g_api->GetTensorMutableData(y_val, &y_ptr));
    if (m == 0 || n == 0) return nullptr;

    thread_local std::vector<kquant::BlockQ8> q8;
    thread_local std::vector<kquant::BlockQ32> q32;
    const float* a = static_cast<const float*>(a_ptr);
    const bool small = qk == kquant::QK32;
    if (small) {
        q32.resize(static_cast<size_t>(m * nb));
        for (int64_t r = 0; r < m; ++r) kquant::quantize_row_q32(a + r * kdim, q32.data() + r * nb, kdim);
    } else {
        q8.resize(static_cast<size_t>(m * nb));
        for (int64_t r = 0; r < m; ++r) kquant::quantize_row_q8(a + r * kdim, q8.data() + r * nb, kdim);
    }

    Task task{k.ggml_type, k.interleave, small ? nullptr : q8.data(), small ? q32.data() : nullptr, m, nb, n,
              static_cast<const uint8_t*>(b_ptr), row_bytes, static_cast<float*>(y_ptr)};
    const size_t tasks = static_cast<size_t>((n + kRowsPerTask - 1) / kRowsPerTask);
    return g_api->KernelContext_ParallelFor(ctx, run_task, tasks, 0, &task);
}

// ------------------------------------------------------------------------------------------------ GgufGather
constexpr int64_t kIdsPerTask = 8;  // embedding rows per parallel task

struct GatherTask {
    int ggml_type;
    int interleave;
    const uint8_t* w;
    int64_t nb, count;
    const int64_t* ids;
    float* y;
};

void run_gather_task(void* data, size_t index) {
    const GatherTask& t = *static_cast<const GatherTask*>(data);
    const int64_t i0 = static_cast<int64_t>(index) * kIdsPerTask;
    const int64_t i1 = i0 + kIdsPerTask < t.count ? i0 + kIdsPerTask : t.count;
    const int64_t k = t.nb * kquant::QK;
    for (int64_t i = i0; i < i1; ++i) {
        if (t.interleave == 8)
            kquant::dequantize_row_x8(t.ggml_type, t.w, t.nb, t.ids[i], t.y + i * k);
        else
            kquant::dequantize_row(t.ggml_type, t.w, t.nb, t.ids[i], t.y + i * k);
    }
}

OrtStatus* compute_gather(const Kernel& k, OrtKernelContext* ctx) {
    const OrtValue* b_val = nullptr;
    const OrtValue* ids_val = nullptr;
    std::vector<int64_t> bd, id;
    ORT_TRY(input(ctx, 0, &b_val, bd));
    ORT_TRY(input(ctx, 1, &ids_val, id));
    if (bd.size() != 2) return fail("GgufGather: B must be uint8 [N, bytes per row], the GGUF tensor's rows");
    const int64_t n = bd[0], row_bytes = bd[1];
    const int bb = kquant::block_bytes(k.ggml_type);
    if (row_bytes <= 0 || row_bytes % bb != 0)
        return fail("GgufGather: B has " + std::to_string(row_bytes) + " bytes per row, not a positive multiple of " +
                    std::to_string(bb) + " (the super-block of ggml_type " + std::to_string(k.ggml_type) + ")");
    if (k.interleave == 8 && n % 8 != 0)
        return fail("GgufGather: interleave = 8 needs N a multiple of 8, not " + std::to_string(n));
    const int64_t nb = row_bytes / bb;
    int64_t count = 1;
    for (int64_t d : id) count *= d;
    void* b_ptr = nullptr;
    void* ids_ptr = nullptr;
    ORT_TRY(g_api->GetTensorMutableData(const_cast<OrtValue*>(b_val), &b_ptr));
    ORT_TRY(g_api->GetTensorMutableData(const_cast<OrtValue*>(ids_val), &ids_ptr));
    const int64_t* ids = static_cast<const int64_t*>(ids_ptr);
    for (int64_t i = 0; i < count; ++i)
        if (ids[i] < 0 || ids[i] >= n)
            return fail("GgufGather: id " + std::to_string(ids[i]) + " is out of range: B has N = " +
                        std::to_string(n) + " rows (ids must be in [0, " + std::to_string(n) + "))");

    std::vector<int64_t> yd(id.begin(), id.end());
    yd.push_back(nb * kquant::QK);
    OrtValue* y_val = nullptr;
    ORT_TRY(g_api->KernelContext_GetOutput(ctx, 0, yd.data(), yd.size(), &y_val));
    void* y_ptr = nullptr;
    ORT_TRY(g_api->GetTensorMutableData(y_val, &y_ptr));
    if (count == 0) return nullptr;
    GatherTask task{k.ggml_type, k.interleave, static_cast<const uint8_t*>(b_ptr), nb, count, ids,
                    static_cast<float*>(y_ptr)};
    const size_t tasks = static_cast<size_t>((count + kIdsPerTask - 1) / kIdsPerTask);
    return g_api->KernelContext_ParallelFor(ctx, run_gather_task, tasks, 0, &task);
}

// ------------------------------------------------------------------------------------------------ OrtCustomOp
OrtStatus* ORT_API_CALL create_kernel_v2(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                         void** kernel) {
    const Op& o = op_of(op);
    int64_t t = 0;
    ORT_TRY(api->KernelInfoGetAttribute_int64(info, "ggml_type", &t));
    const bool small = kquant::block_values(static_cast<int>(t)) == kquant::QK32;
    if (kquant::block_bytes(static_cast<int>(t)) == 0 || (small && o.kind == OpKind::kGather))
        return api->CreateStatus(ORT_INVALID_ARGUMENT,
                                 (std::string(o.name) + ": ggml_type " + std::to_string(t) + " is not supported; use " +
                                  (o.kind == OpKind::kGather ? "12 (Q4_K) or 14 (Q6_K)"
                                                             : "12 (Q4_K), 14 (Q6_K), 8 (Q8_0), 6 (Q5_0) or 3 (Q4_1)")).c_str());
    int64_t il = 0;
    if (OrtStatus* st = api->KernelInfoGetAttribute_int64(info, "interleave", &il)) {  // absent: file order
        api->ReleaseStatus(st);
        il = 0;
    }
    if (il != 0 && il != 8)
        return api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(o.name) + ": interleave " + std::to_string(il) +
                                                        " is not supported; use 0 or 8").c_str());
    if (small && il != 8)
        return api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(o.name) + ": ggml_type " + std::to_string(t) +
                                                        " runs on rows interleaved by 8 only; use interleave 8").c_str());
    *kernel = new (std::nothrow) Kernel{o.kind, static_cast<int>(t), static_cast<int>(il)};
    return *kernel ? nullptr : api->CreateStatus(ORT_FAIL, (std::string(o.name) + ": out of memory").c_str());
}

OrtStatus* ORT_API_CALL compute_v2(void* kernel, OrtKernelContext* ctx) {
    const Kernel& k = *static_cast<const Kernel*>(kernel);
    return k.kind == OpKind::kGather ? compute_gather(k, ctx) : compute_matmul(k, ctx);
}

void ORT_API_CALL destroy(void* kernel) { delete static_cast<Kernel*>(kernel); }

const char* ORT_API_CALL op_name(const OrtCustomOp* op) { return op_of(op).name; }
ONNXTensorElementDataType ORT_API_CALL in_type(const OrtCustomOp* op, size_t i) {
    if (op_of(op).kind == OpKind::kGather)  // (B, ids)
        return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;  // (A, B)
}
size_t ORT_API_CALL in_count(const OrtCustomOp*) { return 2; }
ONNXTensorElementDataType ORT_API_CALL out_type(const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
size_t ORT_API_CALL out_count(const OrtCustomOp*) { return 1; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL io_required(const OrtCustomOp*, size_t) {
    return INPUT_OUTPUT_REQUIRED;
}
Op make_op(OpKind kind, const char* name) {
    Op op;
    edge_spec_ort::init_op(op, kApiVersion);
    op.kind = kind;
    op.name = name;
    op.GetName = op_name;
    op.GetInputType = in_type;
    op.GetInputTypeCount = in_count;
    op.GetOutputType = out_type;
    op.GetOutputTypeCount = out_count;
    op.KernelDestroy = destroy;
    op.GetInputCharacteristic = io_required;
    op.GetOutputCharacteristic = io_required;
    op.CreateKernelV2 = create_kernel_v2;
    op.KernelComputeV2 = compute_v2;
    return op;
}

Op g_matmul = make_op(OpKind::kMatMul, "GgufMatMul");
Op g_gather = make_op(OpKind::kGather, "GgufGather");

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
    g_api = api_base->GetApi(kApiVersion);
    if (g_api == nullptr) {  // an ONNX Runtime older than 1.17; version 1 of the API can still say so
        const OrtApi* v1 = api_base->GetApi(1);
        return v1 ? v1->CreateStatus(ORT_FAIL, "edge-spec's K-quant ops need ONNX Runtime 1.17 or later") : nullptr;
    }
    edge_spec_ort::api() = g_api;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c"))
        return g_api->CreateStatus(ORT_FAIL, "edge-spec's K-quant ops need a CPU with AVX2, FMA and F16C");
    OrtCustomOpDomain* domain = nullptr;
    ORT_TRY(g_api->CreateCustomOpDomain("edge_spec", &domain));
    // The domain must outlive every session using it: it is kept for the life of the process.
    ORT_TRY(g_api->CustomOpDomain_Add(domain, &g_matmul));
    ORT_TRY(g_api->CustomOpDomain_Add(domain, &g_gather));
    ORT_TRY(edge_spec_attention::add_ops(g_api, domain));  // CacheAttention, CacheAttentionF32
    return g_api->AddCustomOpDomain(options, domain);
}

// The instruction set the interleaved kernels run on in this process ("avx512vnni" or "avx2"; kquant.h x8_isa),
// for edge_spec/kernels.py (ctypes) and the benchmarks' version lines.
extern "C" __attribute__((visibility("default"))) const char* edge_spec_kquant_isa() { return kquant::x8_isa(); }
