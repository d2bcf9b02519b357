#pragma once
// The LibTorch calls that differ between the versions we build against (the PyTorch wheel's
// LibTorch 2.x, preferred; Debian's libtorch-dev 1.13, fallback). Everything version-specific
// lives here.
#include <c10/core/Allocator.h>
#include <torch/version.h>

// c10::Allocator::allocate lost its `const` in LibTorch 2.3, which also added copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define DP_ALLOCATOR_ALLOCATE_CONST
#define DP_ALLOCATOR_HAS_COPY_DATA 1
#else
#define DP_ALLOCATOR_ALLOCATE_CONST const
#define DP_ALLOCATOR_HAS_COPY_DATA 0
#endif

namespace dawnpiper {
inline const char* torch_version_string() { return TORCH_VERSION; }
}  // namespace dawnpiper
