// The exception hierarchy of fusedopt: every error the library throws derives from
// fusedopt::Error, so callers can catch one type and still tell user errors from our bugs.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "fusedopt/export.hpp"

namespace fusedopt {

/// Root of every exception fusedopt throws.
class FUSEDOPT_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// The caller used the API wrongly: a bad argument, dtype or target text, a tensor list
/// that does not fit, a call out of order. The message names what and why.
class FUSEDOPT_API UsageError : public Error {
 public:
  using Error::Error;
};

/// Something fusedopt needs is not here: NVRTC, the CUDA driver, a device, or a backend
/// this build left out. The message says how to get it.
class FUSEDOPT_API UnavailableError : public Error {
 public:
  using Error::Error;
};

/// A file could not be read or written, or holds something malformed (a checkpoint, a
/// safetensors file): the message names the file and what went wrong.
class FUSEDOPT_API IoError : public Error {
 public:
  using Error::Error;
};

/// A malformed rule. `what()` is the full compiler-style diagnostic:
/// `FILE:LINE:COL: error: MESSAGE`, the source line, a caret line and an optional hint.
class FUSEDOPT_API RuleError : public Error {
 public:
  RuleError(std::string file, int line, int column, std::string message, std::string source_line,
            int length, std::string hint);

  const std::string& file() const { return file_; }
  int line() const { return line_; }      ///< 1-based
  int column() const { return column_; }  ///< 1-based, in bytes
  const std::string& message() const { return message_; }
  const std::string& source_line() const { return source_line_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string file_;
  int line_;
  int column_;
  std::string message_;
  std::string source_line_;
  std::string hint_;
};

/// A generated (or trusted functor) source that a compiler rejected.
class FUSEDOPT_API CompileError : public Error {
 public:
  CompileError(std::string summary, std::string log, std::vector<std::string> options,
               std::string source);
  const std::string& log() const { return log_; }
  const std::vector<std::string>& options() const { return options_; }
  const std::string& source() const { return source_; }

 private:
  std::string log_;
  std::vector<std::string> options_;
  std::string source_;
};

/// A CUDA driver or NVRTC call that failed; names the call, the result and the site.
class FUSEDOPT_API CudaError : public Error {
 public:
  CudaError(std::string call, int code, std::string result_name, std::string site);
  const std::string& call() const { return call_; }
  int code() const { return code_; }

 private:
  std::string call_;
  int code_;
};

/// The kernel cache refused an operation (unsafe folder, I/O failure).
class FUSEDOPT_API CacheError : public Error {
 public:
  using Error::Error;
};

/// A bug in fusedopt itself: please report it.
class FUSEDOPT_API InternalError : public Error {
 public:
  explicit InternalError(const std::string& what)
      : Error("internal error (a fusedopt bug): " + what) {}
};

}  // namespace fusedopt
