// dawnpiper export-weights CKPT OUT: the parameters of a checkpoint (any of the kept ones, written
// on any number of stages) as one safetensors file under their model names: what --save-weights
// writes after training, for transformers' from_pretrained and for --init-from.
#include <cinttypes>
#include <cstdio>
#include <fstream>

#include "app/commands.h"
#include "cli/options.h"
#include "runtime/checkpoint.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/files.h"
#include "util/safetensors.h"

namespace dawnpiper {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// CKPT as the checkpoint directory and step: a --checkpoint-dir (its `latest`, or --step), or
// one of its step-<k> directories.
std::pair<std::string, int64_t> checkpoint_of(std::string given, int64_t step) {
  while (given.size() > 1 && given.back() == '/') given.pop_back();
  const std::string base = given.substr(given.rfind('/') == std::string::npos ? 0 : given.rfind('/') + 1);
  if (base.rfind("step-", 0) == 0 && base.size() > 5 && base.find_first_not_of("0123456789", 5) == std::string::npos) {
    const int64_t k = std::stoll(base.substr(5));
    if (step >= 0 && step != k)
      throw ConfigError("export-weights: " + given + " is the checkpoint of step " + std::to_string(k) +
                        ", and --step asks for " + std::to_string(step));
    const std::string parent = parent_directory(given);
    return {parent.empty() ? "." : parent, k};
  }
  if (list_directory(given).empty())
    throw ConfigError("export-weights: there is no checkpoint directory '" + given + "'");
  if (step >= 0) return {given, step};
  std::ifstream in(given + "/latest");
  if (!(in >> step) || step < 0) {
    const std::vector<int64_t> kept = complete_checkpoints(given);
    throw ConfigError("export-weights: '" + given + "/latest' is missing or damaged" +
                      (kept.empty() ? std::string(" and no complete checkpoint is kept there")
                                    : "; give --step " + std::to_string(kept.front()) + " (the newest complete one)"));
  }
  return {given, step};
}

}  // namespace

int cmd_export_weights(int argc, char** argv, const MpiWorld& world) {
  po::options_description options("Export options");
  // clang-format off
  options.add_options()
      ("checkpoint", po::value<std::string>(), "a --checkpoint-dir (its latest checkpoint) or one of its step-<k> "
                                               "directories; also the first positional argument")
      ("out", po::value<std::string>(), "a directory (model.safetensors, and config.json for a Hugging Face model) or "
                                        "a .safetensors file; also the second positional argument")
      ("step", po::value<int64_t>(), "the kept checkpoint of this step, not the latest");
  // clang-format on
  po::positional_options_description positional;
  positional.add("checkpoint", 1).add("out", 1);
  po::variables_map vm;
  if (!parse_options(argc, argv, "export-weights",
                     "Writes a checkpoint's weights as safetensors (for from_pretrained and --init-from): "
                     "dawnpiper export-weights CKPT DIR.",
                     options, vm, &positional))
    return 0;
  if (!vm.count("checkpoint") || !vm.count("out"))
    throw ConfigError("give the checkpoint and where to write: dawnpiper export-weights CKPT DIR");
  if (world.rank != 0) return 0;
  const int64_t wanted = vm.count("step") ? vm["step"].as<int64_t>() : -1;
  if (vm.count("step") && wanted < 0) throw ConfigError("--step must be a step (0 or more)");
  const auto [dir, step] = checkpoint_of(vm["checkpoint"].as<std::string>(), wanted);
  const std::string out = vm["out"].as<std::string>();
  const bool file = ends_with(out, ".safetensors");
  const std::string path = file ? out : out + "/model.safetensors";
  if (const std::string problem = checkpoint_damage(dir, step, /*unchecked_ok=*/true); !problem.empty()) {
    std::string way_on;
    for (int64_t kept : complete_checkpoints(dir))
      if (kept != step && checkpoint_damage(dir, kept).empty()) {
        way_on = "; --step " + std::to_string(kept) + " exports the newest complete one";
        break;
      }
    throw ConfigError("export-weights: " + problem + way_on);
  }
  if (const std::string parent = parent_directory(path); !parent.empty()) make_directories(parent);
  check_writable(path);
  const std::vector<CheckpointTensor> parameters = checkpoint_parameters(dir, step);
  std::vector<SafetensorsTensor> tensors;
  int64_t count = 0;
  for (const CheckpointTensor& p : parameters) {
    tensors.push_back({p.name, DType::F32, p.shape, p.values.data()});
    count += static_cast<int64_t>(p.values.size());
  }
  write_safetensors(path, tensors, {{"format", "pt"}});
  // A Hugging Face model's config.json (kept beside the checkpoints), as --save-weights DIR writes it.
  const std::string config = dir + "/hf_config.json";
  const bool hf = !file && std::ifstream(config).good();
  if (hf) write_text_atomically(out + "/config.json", read_text_file(config));
  std::printf("wrote weights %s%s: %zu tensors, %.2fM parameters, of the checkpoint at step %" PRId64 " in %s%s\n",
              path.c_str(), hf ? (" and " + out + "/config.json").c_str() : "", tensors.size(), count / 1e6, step,
              dir.c_str(), hf ? (" (transformers' from_pretrained(\"" + out + "\") loads them)").c_str() : "");
  return 0;
}

}  // namespace dawnpiper
