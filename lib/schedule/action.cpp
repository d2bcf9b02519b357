#include "schedule/action.h"

#include <cctype>
#include <sstream>

#include "util/error.h"

namespace dawnpiper {

bool per_step(ActionKind kind) {
  return kind == ActionKind::OptimizerStep || kind == ActionKind::ReduceTiedGrads || kind == ActionKind::AllReduce;
}

namespace {

bool has_tensor(ActionKind kind) {
  return kind == ActionKind::SwapOut || kind == ActionKind::SwapIn || kind == ActionKind::Recompute;
}
}  // namespace

std::string to_string(const Action& action) {
  std::string s = std::to_string(action.stage) + name_of(action.kind);
  if (!per_step(action.kind)) s += std::to_string(action.micro_batch);
  if (has_tensor(action.kind) && action.tensor >= 0) s += "t" + std::to_string(action.tensor);
  return s;
}

std::string to_string(const std::vector<Action>& actions) {
  std::string s;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (i) s += ' ';
    s += to_string(actions[i]);
  }
  return s;
}

Action parse_action(const std::string& text) {
  auto bad = [&]() { return ConfigError("malformed action '" + text + "' (examples: 2F0, 1SEND_B3, 0U)"); };
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos == 0 || pos > 9) throw bad();
  Action a;
  a.stage = std::stoi(text.substr(0, pos));
  const std::pair<ActionKind, const char*>* found = nullptr;
  for (const auto& kc : EnumNames<ActionKind>::table) {
    std::string code = kc.second;
    if (text.compare(pos, code.size(), code) == 0) {
      found = &kc;
      pos += code.size();
      break;
    }
  }
  if (!found) throw bad();
  a.kind = found->first;
  if (per_step(a.kind)) {
    if (pos != text.size()) throw bad();
    return a;
  }
  size_t start = pos;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos == start || pos - start > 18) throw bad();
  a.micro_batch = std::stoll(text.substr(start, pos - start));
  if (has_tensor(a.kind) && pos < text.size() && text[pos] == 't') {
    start = ++pos;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
    if (pos == start || pos - start > 9) throw bad();
    a.tensor = std::stoi(text.substr(start, pos - start));
  }
  if (pos != text.size()) throw bad();
  return a;
}

std::vector<Action> parse_actions(const std::string& text) {
  std::istringstream in(text);
  std::vector<Action> out;
  std::string word;
  while (in >> word) out.push_back(parse_action(word));
  return out;
}

}  // namespace dawnpiper
