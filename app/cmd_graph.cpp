// dawnpiper graph: build a preset's OpGraph and print a summary (node, edge and parameter counts,
// nodes per op kind).
#include <cstdio>
#include <iostream>
#include <map>

#include "app/commands.h"
#include "cli/options.h"
#include "models/model_config.h"
#include "util/stopwatch.h"

namespace dawnpiper {

int cmd_graph(int argc, char** argv, const MpiWorld& world) {
  po::options_description options;
  po::options_description own("Graph options");
  // clang-format off
  own.add_options()
      ("summary", po::bool_switch(), "print the counts (what graph prints without --nodes)")
      ("list", po::bool_switch(), "list the model presets")
      ("nodes", po::bool_switch(), "print every node: id, kind, block, output shape, parameters (and the counts "
                                   "too with --summary)");
  // clang-format on
  options.add(own).add(model_options()).add(model_override_options());
  po::variables_map vm;
  if (!parse_options(argc, argv, "graph", "Builds a model's fine-grained op graph and summarizes it.", options, vm))
    return 0;
  if (world.rank != 0) return 0;
  if (vm["list"].as<bool>()) {
    for (const std::string& p : preset_names()) {
      ModelConfig c = preset_config(p);
      std::printf("%-16s %s\n", p.c_str(), name_of(c.family));
    }
    return 0;
  }
  const Stopwatch clock;
  const ModelSource model = model_source_from(vm);
  OpGraph g = model.graph(vm["micro-batch-size"].as<int64_t>());
  const double ms = clock.ms();
  int64_t edges = 0;
  for (const TensorInfo& t : g.tensors) edges += static_cast<int64_t>(t.consumers.size());
  std::map<std::string, int> per_kind;
  // Imported nodes count by their ATen operator.
  auto kind_of = [](const Node& n) {
    return n.kind == OpKind::Aten ? n.call.qualified() : std::string(op_kind_name(n.kind));
  };
  for (const Node& n : g.nodes) ++per_kind[kind_of(n)];
  if (vm["nodes"].as<bool>()) {
    for (const Node& n : g.nodes) {
      int64_t params = 0;
      for (const ParamSpec& p : n.params)
        if (!p.tied()) params += numel(p.shape);
      std::printf("%5d %-14s %-18s %-24s params=%lld %s\n", n.id, kind_of(n).c_str(), g.blocks[n.block].c_str(),
                  shape_str(g.tensor(n.outputs[0]).shape).c_str(), static_cast<long long>(params), n.name.c_str());
    }
  }
  if (vm["nodes"].as<bool>() && !vm["summary"].as<bool>()) return 0;
  std::printf("model        %s (%s), micro-batch %lld, %s\n", g.preset.c_str(), g.model.c_str(),
              static_cast<long long>(g.micro_batch_size), name_of(g.precision));
  std::printf("nodes        %d\n", g.size());
  std::printf("edges        %lld\n", static_cast<long long>(edges));
  std::printf("blocks       %zu\n", g.blocks.size());
  std::printf("parameters   %lld (%.2fM)\n", static_cast<long long>(g.parameter_count()), g.parameter_count() / 1e6);
  std::printf("build time   %.1f ms\n", ms);
  std::printf("op kinds:\n");
  for (const auto& kv : per_kind) std::printf("  %-28s %d\n", kv.first.c_str(), kv.second);
  return 0;
}

}  // namespace dawnpiper
