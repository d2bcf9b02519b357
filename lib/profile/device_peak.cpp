#include "profile/device_peak.h"

#include <cstdio>

#ifdef DAWNPIPER_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dawnpiper {

namespace {
struct Row {
  const char* name_has;  // the first row whose text the device's name contains
  double bf16, fp32;     // dense TFLOP/s
};
// NVIDIA data sheets: H100/H200 SXM 989.4 bf16 and 66.9 fp32; H100 PCIe 756 and 51.2;
// A100 312 and 19.5; L40S 362 and 91.6; L4 121 and 30.3.
constexpr Row kPeaks[] = {{"H100 PCIe", 756.0, 51.2}, {"H100", 989.4, 66.9}, {"H200", 989.4, 66.9},
                          {"GH200", 989.4, 66.9},     {"A100", 312.0, 19.5}, {"L40S", 362.0, 91.6},
                          {"L4", 121.0, 30.3}};
}  // namespace

PeakFlops peak_flops_of(const std::string& name, Precision precision) {
  for (const Row& row : kPeaks)
    if (name.find(row.name_has) != std::string::npos) {
      const double tflops = precision == Precision::Bf16 ? row.bf16 : row.fp32;
      char what[160];
      std::snprintf(what, sizeof what, "%s, %s dense %.0f TFLOP/s", name.c_str(),
                    precision == Precision::Bf16 ? "bf16" : "fp32", tflops);
      return {tflops * 1e12, what};
    }
  return {0, name + ": peak not in DawnPiper's table"};
}

PeakFlops device_peak_flops(c10::Device device, Precision precision) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, device.index() < 0 ? 0 : device.index()) != cudaSuccess)
      return {0, "the GPU's name could not be read"};
    return peak_flops_of(props.name, precision);
  }
#endif
  (void)precision;
  return {0, device.str() + ": no peak"};
}

}  // namespace dawnpiper
