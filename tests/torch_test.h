#pragma once
// Include this instead of <catch2/catch.hpp> in tests that use LibTorch: c10's logging header
// defines a CHECK macro that aborts; Catch's must win.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#undef CHECK
#include <catch2/catch.hpp>
