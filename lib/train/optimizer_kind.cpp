#include "train/optimizer_kind.h"

#include <ostream>

#include "util/error.h"

namespace dawnpiper {}  // namespace dawnpiper
