#pragma once
// Writing trained weights as one safetensors file under their PyTorch names (imported models)
// or graph names (presets): what transformers' from_pretrained loads. Every rank passes its
// stage's parameters; rank 0 writes the file, each weight once (a tied weight from the lowest
// stage holding it).
#include <mpi.h>

#include <string>
#include <vector>

#include "exec/stage_module.h"

namespace dawnpiper {

// Collective over `comm`. Only rank 0 writes (atomically).
void save_weights(const std::vector<StageParameter>& parameters, const std::string& path, MPI_Comm comm);

}  // namespace dawnpiper
