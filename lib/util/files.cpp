#include "util/files.h"

#include <dirent.h>
#include <ftw.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace dawnpiper {

void make_directories(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos < path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      throw ConfigError("cannot create directory '" + prefix + "': " + std::strerror(errno));
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw ConfigError("'" + path + "' is not a directory");
}

void check_readable(const std::string& path, const std::string& option) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw ConfigError(option + " " + path + ": " + (errno == ENOENT ? "no such file" : std::strerror(errno)));
  ::close(fd);
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "" : slash == 0 ? "/" : path.substr(0, slash);
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = opendir(path.c_str());
  if (!dir) return names;
  while (const dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void remove_tree(const std::string& path) {
  // Depth first, without following symbolic links.
  nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int, FTW*) {
        std::remove(p);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace dawnpiper
