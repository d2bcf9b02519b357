#pragma once
// Random numbers that depend only on a seed: a generator of its own per draw, on the device the
// tensor lives on. A dropout mask drawn from (seed, node, step, micro-batch) is the same whether
// a recomputation, another schedule or another stage split draws it, and whatever was drawn
// before. CPU and CUDA generators are different algorithms: the two devices draw different
// masks from the same seed.
#include <cstdint>

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

namespace dawnpiper {

at::Generator seeded_generator(c10::Device device, uint64_t seed);

}  // namespace dawnpiper
