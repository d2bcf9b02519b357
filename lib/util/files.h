#pragma once
// Directory helpers on POSIX calls. Not std::filesystem: libtorch.so exports its own build of
// some std::filesystem functions, and the dynamic linker may bind ours to them (remove_all
// crashed that way).
#include <string>
#include <vector>

namespace dawnpiper {

// mkdir -p; throws ConfigError naming the path when it cannot.
void make_directories(const std::string& path);
// Names of the entries of a directory (not "." and ".."); empty if it cannot be read.
std::vector<std::string> list_directory(const std::string& path);
// The whole file; throws ConfigError "cannot read '<path>'" when it cannot.
std::string read_text_file(const std::string& path);
// Throws ConfigError "<option> <path>: no such file" (or the system's reason) unless the file can
// be opened for reading: an input checked before any work.
void check_readable(const std::string& path, const std::string& option);
// The directory part of a path ("" for a bare name).
std::string parent_directory(const std::string& path);
// rm -r; errors are ignored (clean-up of old checkpoints).
void remove_tree(const std::string& path);

}  // namespace dawnpiper
