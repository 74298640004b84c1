// edge_spec::CacheAttention / CacheAttentionF32 (attention.cpp): causal grouped-query attention over a KV cache
// updated in place, registered beside the K-quant ops by gguf_ops.cpp's RegisterCustomOps.
#pragma once

#include "onnxruntime_c_api.h"

namespace edge_spec_attention {

// Adds both ops to ``domain``; ``ort`` is the OrtApi the library registered with (ort_helpers.h's api() too).
OrtStatus* add_ops(const OrtApi* ort, OrtCustomOpDomain* domain);

}  // namespace edge_spec_attention
