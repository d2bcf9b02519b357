#include "util/json.h"

#include "util/error.h"

namespace dawnpiper {

void throw_json_error(const std::string& what, const nlohmann::json::exception& e) {
  std::string message = e.what();  // "[json.exception.type_error.302] type must be string, but is number"
  if (!message.empty() && message.front() == '[') message.erase(0, message.find("] ") + 2);
  throw ConfigError(what + ": " + message);
}

}  // namespace dawnpiper
