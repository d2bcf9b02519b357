#pragma once
// Profiles in HDF5 (schema: docs/profile-format.md). Writes go to a temporary file that is
// renamed when complete, so an interrupted run never leaves a truncated profile.
#include <string>

#include "profile/profile.h"

namespace dawnpiper {

void write_profile(const Profile& profile, const std::string& path);
// Throws ConfigError if the file is missing, not a DawnPiper profile, or of another schema version.
Profile read_profile(const std::string& path);

}  // namespace dawnpiper
