// What both op files (gguf_ops.cpp, attention.cpp) need from ONNX Runtime's C API beyond the calls themselves: the
// OrtApi the library registered with, one-sentence errors, early returns on a failed call, a tensor's dimensions.
#pragma once

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "onnxruntime_c_api.h"

namespace edge_spec_ort {

// The OrtApi RegisterCustomOps obtained; set there once, before any kernel runs.
inline const OrtApi*& api() {
    static const OrtApi* value = nullptr;
    return value;
}

inline OrtStatus* fail(const std::string& msg) { return api()->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

}  // namespace edge_spec_ort

#define ORT_TRY(expr)                           \
    do {                                        \
        OrtStatus* status_ = (expr);            \
        if (status_ != nullptr) return status_; \
    } while (0)

namespace edge_spec_ort {

// The dimensions of tensor ``v`` into ``dims``.
inline OrtStatus* dims_of(const OrtValue* v, std::vector<int64_t>& dims) {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    ORT_TRY(api()->GetTensorTypeAndShape(v, &info));
    size_t count = 0;
    OrtStatus* st = api()->GetDimensionsCount(info, &count);
    if (st == nullptr) {
        dims.assign(count, 0);
        st = api()->GetDimensions(info, dims.data(), count);
    }
    api()->ReleaseTensorTypeAndShapeInfo(info);
    return st;
}

}  // namespace edge_spec_ort

namespace edge_spec_ort {

// An OrtCustomOp zeroed, with what every edge-spec op answers alike: CPU, default memory, no variadic inputs or
// outputs, every opset version. The caller adds its name, types, counts, characteristics and kernel functions.
inline void init_op(OrtCustomOp& op, uint32_t version) {
    std::memset(&op, 0, sizeof(OrtCustomOp));
    op.version = version;
    op.GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return "CPUExecutionProvider"; };
    op.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
    op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
    op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
    op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
    op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
    op.GetStartVersion = [](const OrtCustomOp*) { return 1; };
    op.GetEndVersion = [](const OrtCustomOp*) { return INT_MAX; };
}

}  // namespace edge_spec_ort
