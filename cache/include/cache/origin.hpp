// Where a binary handed out by the cache came from: the memory tier, the disk tier, or a
// fresh compile.
#pragma once

namespace fusedopt::cache {

enum class Origin { Memory, Disk, Compiled };
/// "memory", "disk" or "compiled".
const char* to_string(Origin origin);

}  // namespace fusedopt::cache
