#pragma once
// Writing output files so that an interrupted or failed run never leaves a half-written file:
// write to "<path>.tmp.<pid>", then rename over <path>.
#include <functional>
#include <string>

namespace dawnpiper {

// Calls write(tmp_path) and renames tmp_path to path; removes tmp_path if write throws.
// Throws ConfigError if the directory is not writable.
void write_atomically(const std::string& path, const std::function<void(const std::string&)>& write);
// Throws ConfigError now if `path` could not be written later (checked before long work).
void check_writable(const std::string& path);
// Convenience for text content.
void write_text_atomically(const std::string& path, const std::string& content);

}  // namespace dawnpiper
