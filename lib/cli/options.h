#pragma once
// Command-line and .ini options shared by the subcommands (Boost.Program_options). Every option
// can be given on the command line or in the --config file (same names, "key = value" lines);
// the command line wins.
#include <functional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "models/model_config.h"
#include "models/model_source.h"
#include "plan/plan.h"
#include "plan/plan_options.h"
#include "data/token_file.h"
#include "memory/device_memory.h"
#include "profile/profiler.h"
#include "runtime/pipeline_transport.h"
#include "train/lr_schedule.h"
#include "util/progress.h"
#include "util/enum_names.h"
#include "util/error.h"

namespace dawnpiper {

namespace po = boost::program_options;

// --config --model --model-file --precision --micro-batch-size: what selects the model (all a
// subcommand that only builds the graph takes).
po::options_description model_options();
// model_options(), --init-from --seed (the weights), --device --device-memory, and of
// --micro-batches and --quiet those the subcommand reads.
struct RunOptionSet {
  bool micro_batches = true, quiet = true;
};
po::options_description run_options(const RunOptionSet& set = {});
// --allocator-headroom: what a subcommand that plans against --device-memory takes besides.
po::options_description allocator_headroom_option();
// --stages --virtual-stages --data-parallel --schedule --planner --optimizer --memopt
// --zero-stage --bucket-size: how a pipeline is planned, declared once for `plan` and `train` with one set of
// defaults (1f1b, the dawnpiper planner, no memory optimization, a stage per MPI rank), so that
// `plan` then `train --plan-in` trains what `train` alone would.
po::options_description planning_options();
// The plan a run asks for, read once for `plan` and `train`: planning_options() with
// --micro-batches. ranks and data_parallel are --stages and --data-parallel, 0
// where not given (the MPI ranks decide); the capacity and the links are the device's, set where
// it is known. Checked before any work (ConfigError): --stages or --data-parallel below 1, a
// --zero-stage outside 0-3 or above 0 under a schedule it cannot run, a bucket below
// one element, a schedule file written for other sizes.
PlanRequest plan_request_from(const po::variables_map& vm);
// --replica-bandwidth, `train`'s and `plan`'s own option (train measures the link where it is not
// given, plan takes --link-bandwidth; no plan fixes it): bytes/s, 0 where not given.
double replica_bandwidth_option(const po::variables_map& vm);
// --replica-drag (PlanSettings::replica_drag), -1 where not given; ConfigError below 0.
double replica_drag_option(const po::variables_map& vm);

// What a plan fixes of a run: the planning options, the micro-batch size and the precision. A
// plan's (planned_run), or a run's request, to compare with one.
struct PlannedRun {
  PlanRequest request;  // ranks: pipeline ranks; data_parallel: replicas
  int64_t micro_batch_size = 0;
  Precision precision = Precision::Fp32;
};
PlannedRun planned_run(const Plan& plan);
// One option a plan fixes, named as the command line names it: `train --plan-in` takes its value
// into the options (adopt_plan_settings), and a resumed run compares it with its checkpoint's plan
// (run/agreed_plan.h: resumed_plan_changes).
struct PlannedOption {
  std::string key;
  bool resumed = false;        // a resumed run takes it from its checkpoint's plan where not given
  bool with_schedule = false;  // ... only with the plan's schedule (its own default under another)
  std::function<boost::any(const PlannedRun&)> value;  // as the option holds it
  std::function<bool(const boost::any& given, const boost::any& planned)> agrees;
  std::function<std::string(const boost::any&)> text;      // for messages
  std::function<std::string(const PlannedRun&)> compared;  // "": not compared
};
// Every one, in the order messages name them. Adding a planning option adds its line here.
const std::vector<PlannedOption>& planned_options();
// --layers --decoder-layers --hidden --heads --ffn --vocab --seq-len --image-size --classes
// --in-features --output-chunks --loss-chunk-tokens --attention --dropout
po::options_description model_override_options();

// Parses argv (after the subcommand) against `options` plus --help, then the --config file if
// given. Returns false if --help was printed (the caller exits 0). Bad options, unreadable
// config files: ConfigError.
bool parse_options(int argc, char** argv, const std::string& subcommand, const std::string& summary,
                   const po::options_description& options, po::variables_map& vm,
                   const po::positional_options_description* positional = nullptr);

// Enum-valued options (every enum with EnumNames: --schedule, --planner, --memopt, --optimizer,
// --lr-schedule, --transport, --progress, --data-order, --timing) are parsed into their enum as
// the options are read, so a bad name is one error naming the option and the choices before any
// work, whatever the subcommand does next. Boost finds this by argument-dependent lookup (and
// prefers it to its own, whose last parameter is a long).
template <class E, std::enable_if_t<has_enum_names<E>::value, int> = 0>
void validate(boost::any& value, const std::vector<std::string>& tokens, E*, int) {
  po::validators::check_first_occurrence(value);
  const std::string& token = po::validators::get_single_string(tokens);
  try {
    value = boost::any(from_name<E>(token));
  } catch (const ConfigError& e) {
    throw po::error_with_option_name("%canonical_option%: " + e.reason());  // Boost names the option
  }
}

// The model preset from --model with the override options applied and checked.
ModelConfig model_config_from(const po::variables_map& vm);
// The model: --model-file (with --init-from) if given, else the --model preset with overrides.
// Mixing the two is a ConfigError.
ModelSource model_source_from(const po::variables_map& vm);

}  // namespace dawnpiper
