// The public safetensors reader and writer (fusedopt/safetensors.hpp) over io/safetensors:
// the header is validated once, tensors are read by range with pread.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>

#include "fusedopt/error.hpp"
#include "fusedopt/safetensors.hpp"
#include "io/safetensors.hpp"
#include "support/file_io.hpp"
#include "support/unique_fd.hpp"

namespace fusedopt {

struct SafetensorsReader::Impl {
  std::filesystem::path path;
  io::SafetensorsFile header;  ///< without data
  std::uint64_t data_offset = 0;
  support::UniqueFd fd;
};

SafetensorsReader::SafetensorsReader(const std::filesystem::path& path)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->header = io::read_safetensors_header(path, &impl_->data_offset);
  impl_->fd = support::UniqueFd(support::open_retry(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!impl_->fd) {
    throw IoError(fmt::format("{}: cannot open: {}", path.string(), support::errno_text(errno)));
  }
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const std::filesystem::path& SafetensorsReader::path() const { return impl_->path; }

const std::map<std::string, std::string>& SafetensorsReader::metadata() const {
  return impl_->header.metadata;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : impl_->header.tensors) out.push_back(name);
  return out;
}

bool SafetensorsReader::has(const std::string& name) const {
  return impl_->header.tensors.count(name) != 0;
}

SafetensorsReader::Entry SafetensorsReader::entry(const std::string& name) const {
  auto it = impl_->header.tensors.find(name);
  if (it == impl_->header.tensors.end()) {
    throw IoError(fmt::format("{}: no tensor '{}'", impl_->path.string(), name));
  }
  return Entry{it->second.dtype, it->second.shape, it->second.end - it->second.begin};
}

void SafetensorsReader::read(const std::string& name, std::uint64_t begin, std::uint64_t bytes,
                             void* out) const {
  auto it = impl_->header.tensors.find(name);
  if (it == impl_->header.tensors.end()) {
    throw IoError(fmt::format("{}: no tensor '{}'", impl_->path.string(), name));
  }
  const io::SafetensorsFile::Entry& e = it->second;
  const std::uint64_t size = e.end - e.begin;
  if (begin > size || bytes > size - begin) {
    throw IoError(fmt::format("{}: bytes [{}, {}) are not inside tensor '{}' ({} bytes)",
                              impl_->path.string(), begin, begin + bytes, name, size));
  }
  auto* dst = static_cast<char*>(out);
  std::uint64_t done = 0;
  while (done < bytes) {
    const auto at = static_cast<off_t>(impl_->data_offset + e.begin + begin + done);
    const ssize_t n = ::pread(impl_->fd.get(), dst + done, bytes - done, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw IoError(fmt::format("{}: cannot read tensor '{}': {}", impl_->path.string(), name,
                                n == 0 ? std::string("the file is shorter than its header says")
                                       : support::errno_text(errno)));
    }
    done += static_cast<std::uint64_t>(n);
  }
}

const std::string& SafetensorsReader::checksum() const { return impl_->header.checksum; }

bool SafetensorsReader::verify() const {
  return io::read_safetensors(impl_->path).data_checked;  // throws IoError on a mismatch
}

namespace {

std::vector<io::TensorView> views_of(const std::vector<SafetensorsTensor>& tensors) {
  std::vector<io::TensorView> views;
  views.reserve(tensors.size());
  for (const SafetensorsTensor& t : tensors) {
    views.push_back({t.name,
                     safetensors_name(t.dtype),
                     {t.numel},
                     t.data,
                     static_cast<std::size_t>(t.numel) * dtype_size(t.dtype)});
  }
  return views;
}

}  // namespace

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  io::write_safetensors(path, views_of(tensors), metadata);
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(std::size_t, void*)>& source) {
  io::write_safetensors_streamed(path, views_of(tensors), metadata, source);
}

}  // namespace fusedopt
