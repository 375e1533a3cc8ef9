// The version of fusedopt: the one place it is written. CMake reads these lines before
// project(), and the kernel cache and checkpoints record the string.
#pragma once

#define FUSEDOPT_VERSION_MAJOR 0
#define FUSEDOPT_VERSION_MINOR 1
#define FUSEDOPT_VERSION_PATCH 0
/// "MAJOR.MINOR.PATCH" (CMake checks that it agrees with the three numbers above).
#define FUSEDOPT_VERSION_STRING "0.1.0"
