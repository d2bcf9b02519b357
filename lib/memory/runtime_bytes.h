#pragma once
// What a device's runtime and libraries keep allocated through the device allocator once the
// kinds of kernels a model uses have run, besides any tensor of the model: on CUDA the cuBLAS and
// cuBLASLt workspaces, one per (handle, stream), and a handle per thread (the forward's and
// autograd's backward thread): about 65 MiB on an H200. The CUDA caching allocator's statistics
// count them, so every stage's measured peak holds them; the plan adds them to every prediction
// (Profile::runtime_bytes, MemoryBreakdown::runtime).
#include <cstdint>
#include <string>

#include <c10/core/Device.h>

#include "util/dtype.h"

namespace dawnpiper {

// Measured once per process and device: live bytes after a warm-up forward and backward of
// matrix products (with and without bias, batched) and, with `convolutions`, a convolution, in
// fp32 and (bf16 precision) in bf16, with every warm-up tensor freed. Call it before the model's
// first product on `device` (the profiler does, first thing): once the workspaces exist they
// are not new. 0 on the CPU, whose kernels keep nothing allocated between calls.
int64_t measure_runtime_bytes(c10::Device device, Precision precision, bool convolutions);

}  // namespace dawnpiper
