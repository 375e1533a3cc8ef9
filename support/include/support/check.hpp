// One check macro per kind of error, so that every message has the same shape: the
// condition that must hold, then fmt-style text naming what is wrong and why (and, for
// UnavailableError, how to get it). Header-only; users link fmt.
#pragma once

#include <fmt/format.h>

#include "fusedopt/error.hpp"

/// Throws `Kind(fmt::format(...))` unless `cond` holds.
#define FUSEDOPT_CHECK_KIND(Kind, cond, ...)                         \
  do {                                                               \
    if (!(cond)) throw ::fusedopt::Kind(::fmt::format(__VA_ARGS__)); \
  } while (0)

/// API misuse: a bad argument, dtype or target text, a call out of order.
#define FUSEDOPT_CHECK_USAGE(cond, ...) FUSEDOPT_CHECK_KIND(UsageError, cond, __VA_ARGS__)
/// Something fusedopt needs is missing (NVRTC, the driver, a device, a backend).
#define FUSEDOPT_CHECK_AVAILABLE(cond, ...) FUSEDOPT_CHECK_KIND(UnavailableError, cond, __VA_ARGS__)
/// A file could not be read or written, or is malformed.
#define FUSEDOPT_CHECK_IO(cond, ...) FUSEDOPT_CHECK_KIND(IoError, cond, __VA_ARGS__)
/// Our own invariant (a fusedopt bug when it fails).
#define FUSEDOPT_CHECK_INTERNAL(cond, ...) FUSEDOPT_CHECK_KIND(InternalError, cond, __VA_ARGS__)
