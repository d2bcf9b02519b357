#pragma once
// The dense peak FLOP/s of the GPU a rank runs on, for MFU: model FLOPs per second over the
// peak of the GPUs the run uses. From the vendors' data sheets (dense, no sparsity): bf16 tensor
// cores for bf16 runs; for fp32 runs the fp32 (non-tensor-core) rate, as LibTorch leaves TF32 off
// for matrix products by default.
#include <string>

#include <c10/core/Device.h>

#include "util/dtype.h"

namespace dawnpiper {

struct PeakFlops {
  double flops = 0;  // 0: not known (the CPU, a GPU outside the table)
  std::string what;  // "NVIDIA H100 80GB HBM3, bf16 dense 989 TFLOP/s", or why unknown
};

PeakFlops device_peak_flops(c10::Device device, Precision precision);
// The table alone, by the device's name (tests).
PeakFlops peak_flops_of(const std::string& device_name, Precision precision);

}  // namespace dawnpiper
