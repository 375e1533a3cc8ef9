// safetensors reading, validation and atomic writing; see safetensors.hpp.
#include "io/safetensors.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedopt/checkpoint_format.hpp"
#include "fusedopt/error.hpp"
#include "io/json.hpp"
#include "support/atomic_write.hpp"
#include "support/check.hpp"
#include "support/file_io.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fusedopt::io copies tensor bytes verbatim and assumes a little-endian host"
#endif

namespace fusedopt::io {
namespace {

// The reference implementation refuses headers above 100 MB; so do we, which also bounds
// what a corrupt length field can make us allocate.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// At most this many tensors in one file. The smallest entry takes about 50 header bytes, so
// the header limit alone allows about 2 M; this bound is stated on its own so that the
// refusal names the count. An Optimizer checkpoint holds (states + master) per param, far
// below it.
constexpr std::size_t kMaxTensors = 1'000'000;
// At most this many dimensions per shape (torch allows 64 too).
constexpr std::size_t kMaxDims = 64;
constexpr const char* kMetadataKey = "__metadata__";

// XXH3-64 of the data section as 16 hex digits: the whole-file check safetensors lacks.
std::string hex64(std::uint64_t v) { return fmt::format("{:016x}", v); }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Elements times element size, or false on a negative dimension or when the product of the
// nonzero dimensions times the element size leaves int64 (a zero dimension elsewhere must not
// hide [0, 2^62, 2^62], whose element count a reader multiplying in another order overflows).
bool shape_bytes(const std::vector<std::int64_t>& shape, int elem_bytes, std::uint64_t* out) {
  std::int64_t n = elem_bytes;
  bool empty = false;
  for (std::int64_t d : shape) {
    if (d < 0) return false;
    if (d == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = empty ? 0 : static_cast<std::uint64_t>(n);
  return true;
}

std::string header_json(const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) h += ',';
      first = false;
      append_json_string(h, key);
      h += ':';
      append_json_string(h, value);
    }
    h += '}';
  }
  std::uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (h.size() > 1) h += ',';
    append_json_string(h, t.name);
    h += fmt::format(R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", t.dtype,
                     fmt::join(t.shape, ","), offset, offset + t.bytes);
    offset += t.bytes;
  }
  h += '}';
  // Padding keeps the data section 8-byte aligned for readers that mmap the file.
  while ((8 + h.size()) % 8 != 0) h += ' ';
  return h;
}

void validate_for_write(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata, bool need_data = true) {
  auto fail = [&](const std::string& what) { throw IoError(path.string() + ": " + what); };
  // What read_safetensors() refuses is never written.
  if (tensors.size() > kMaxTensors) {
    fail(fmt::format("{} tensors, above the limit of {}", tensors.size(), kMaxTensors));
  }
  std::set<std::string_view> names;
  for (const TensorView& t : tensors) {
    if (t.name.empty()) fail("a tensor has an empty name");
    if (t.name == kMetadataKey) fail("tensor name \"__metadata__\" is reserved");
    if (!is_valid_utf8(t.name)) fail(fmt::format("tensor name '{}' is not valid UTF-8", t.name));
    if (!names.insert(t.name).second) fail(fmt::format("duplicate tensor name '{}'", t.name));
    int elem = dtype_bytes(t.dtype);
    if (elem == 0) fail(fmt::format("tensor '{}': unknown dtype \"{}\"", t.name, t.dtype));
    std::uint64_t expected = 0;
    if (!shape_bytes(t.shape, elem, &expected)) {
      fail(fmt::format("tensor '{}': shape {} has a negative dimension or overflows", t.name,
                       shape_text(t.shape)));
    }
    if (expected != t.bytes) {
      fail(fmt::format("tensor '{}': {} bytes given but shape {} of {} needs {}", t.name, t.bytes,
                       shape_text(t.shape), t.dtype, expected));
    }
    if (need_data && t.bytes > 0 && t.data == nullptr) {
      fail(fmt::format("tensor '{}': data is null", t.name));
    }
  }
  for (const auto& [key, value] : metadata) {
    if (!is_valid_utf8(key) || !is_valid_utf8(value)) {
      fail(fmt::format("metadata entry '{}' is not valid UTF-8", key));
    }
  }
  for (const char* key : {kChecksumKey, kDataChecksumKey}) {
    if (metadata.count(key) != 0) {
      fail(fmt::format("metadata entry '{}' is reserved: the writer computes it", key));
    }
  }
}

/// XXH3-64 over a sequence of byte ranges.
class Digest {
 public:
  Digest() : state_(XXH3_createState()) {
    FUSEDOPT_CHECK_INTERNAL(state_ != nullptr, "XXH3_createState failed");
    XXH3_64bits_reset(state_);
  }
  ~Digest() { XXH3_freeState(state_); }
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void add(const void* data, std::size_t bytes) { XXH3_64bits_update(state_, data, bytes); }
  std::string hex() const { return hex64(XXH3_64bits_digest(state_)); }

 private:
  XXH3_state_t* state_;
};

constexpr std::size_t kDigestChars = 16;

/// The 8-byte little-endian header length that starts a safetensors file.
std::string length_field(std::size_t header_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) {
    out[static_cast<std::size_t>(i)] =
        static_cast<char>((static_cast<std::uint64_t>(header_bytes) >> (8 * i)) & 0xFF);
  }
  return out;
}

/// Where the checksum's value starts in a header as fusedopt writes it (compact JSON: the
/// quoted key right after the '{' or ',' that opens or continues the metadata object, then
/// ':' and the value's quote), or npos when it is not there exactly once. A quote inside a
/// string is escaped, so this spelling cannot occur inside another key or value.
std::size_t checksum_value_at(const std::string& header) {
  const std::string key = fmt::format("\"{}\":\"", kChecksumKey);
  std::size_t found = std::string::npos;
  for (std::size_t at = header.find(key); at != std::string::npos; at = header.find(key, at + 1)) {
    if (at == 0 || (header[at - 1] != '{' && header[at - 1] != ',')) continue;
    if (found != std::string::npos) return std::string::npos;
    found = at + key.size();
  }
  return found;
}

/// The first bytes of a file as the writers lay them out: the 8-byte length field, then the
/// header with the checksum's value as 16 '0's; `*value_at` is where that value starts
/// within `head`, for the digest to replace it once the data has been hashed.
std::string file_head(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                      const std::map<std::string, std::string>& metadata, std::size_t* value_at) {
  std::map<std::string, std::string> with_checksum = metadata;
  with_checksum.emplace(kChecksumKey, std::string(kDigestChars, '0'));
  const std::string header = header_json(tensors, with_checksum);
  if (header.size() > kMaxHeaderBytes) {
    throw IoError(fmt::format("{}: the header takes {} bytes, above the limit of {}", path.string(),
                              header.size(), kMaxHeaderBytes));
  }
  std::string head = length_field(header.size()) + header;
  const std::size_t at = checksum_value_at(header);
  FUSEDOPT_CHECK_INTERNAL(at != std::string::npos, "the checksum placeholder is not in the header");
  *value_at = 8 + at;
  return head;
}

/// The options of every save: a crashed save's temps are cleaned (after their grace), and
/// only a regular file is replaced.
support::AtomicWriteOptions save_options() {
  support::AtomicWriteOptions options;
  options.remove_stale_temps = true;  // a crashed save's temp must not pile up beside it
  options.regular_target_only = true;
  return options;
}

/// The IoError of a save refused because `path` is there and is not a regular file.
[[noreturn]] void refuse_target(const std::filesystem::path& path) {
  struct stat st {};
  std::string what = "something other than a regular file";
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const std::filesystem::path to = std::filesystem::read_symlink(path, ec);
      what = fmt::format("a symbolic link (to {}): save to the file it points to", to.string());
    } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      what = S_ISFIFO(st.st_mode) ? "a FIFO" : "a device node";
    } else if (S_ISDIR(st.st_mode)) {
      what = "a folder";
    }
  }
  throw IoError(
      fmt::format("{}: cannot write: it is {}, not a regular file (a save replaces "
                  "only a regular file)",
                  path.string(), what));
}

}  // namespace

int dtype_bytes(const std::string& st_dtype) {
  static const std::map<std::string, int, std::less<>> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},     {"C64", 8}};
  auto it = kSizes.find(st_dtype);
  return it == kSizes.end() ? 0 : it->second;
}

const void* SafetensorsFile::tensor_data(const std::string& name) const {
  auto it = tensors.find(name);
  FUSEDOPT_CHECK_USAGE(it != tensors.end(), "no tensor named '{}' in the file", name);
  return data.data() + it->second.begin;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  validate_for_write(path, tensors, metadata);
  std::size_t value_at = 0;
  std::string head = file_head(path, tensors, metadata, &value_at);
  Digest digest;
  digest.add(head.data(), head.size());
  for (const TensorView& t : tensors) digest.add(t.data, t.bytes);
  head.replace(value_at, kDigestChars, digest.hex());

  const support::AtomicWriteOptions options = save_options();
  support::AtomicWriteResult written = support::atomic_write(
      path,
      [&](int fd) {
        bool ok = support::write_all(fd, head.data(), head.size());
        for (std::size_t i = 0; ok && i < tensors.size(); ++i) {
          ok = support::write_all(fd, static_cast<const char*>(tensors[i].data), tensors[i].bytes);
        }
        return ok;
      },
      options);
  if (written.ok()) return;
  if (std::string_view(written.step) == "target") refuse_target(path);
  if (written.published()) {
    // The rename is durable only once the folder itself is on disk.
    throw IoError(fmt::format("{}: written, but fsync of folder {} failed: {}", path.string(),
                              written.folder.string(), support::errno_text(written.err)));
  }
  const std::string_view step = written.step;
  throw IoError(fmt::format("{}: cannot write ({} {}: {})", path.string(),
                            step == "rename" ? "rename to the target" : step, written.temp.string(),
                            support::errno_text(written.err)));
}

void write_safetensors_streamed(const std::filesystem::path& path,
                                const std::vector<TensorView>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                const TensorSource& source) {
  validate_for_write(path, tensors, metadata, /*need_data=*/false);
  // The checksum goes into the header, which comes first: the placeholder is written, and
  // overwritten once the data has streamed through.
  std::size_t value_at = 0;
  const std::string head = file_head(path, tensors, metadata, &value_at);
  const support::AtomicWriteOptions options = save_options();
  std::string source_error;
  support::AtomicWriteResult written = support::atomic_write(
      path,
      [&](int fd) {
        bool ok = support::write_all(fd, head.data(), head.size());
        Digest digest;
        digest.add(head.data(), head.size());
        std::vector<char> buffer;
        for (std::size_t i = 0; ok && i < tensors.size(); ++i) {
          buffer.resize(tensors[i].bytes);
          try {
            source(i, buffer.data());
          } catch (const std::exception& e) {
            source_error = e.what();
            errno = EIO;
            ok = false;
            break;
          }
          digest.add(buffer.data(), buffer.size());
          ok = support::write_all(fd, buffer.data(), buffer.size());
        }
        if (ok) {
          const std::string hex = digest.hex();
          ok = ::pwrite(fd, hex.data(), hex.size(), static_cast<off_t>(value_at)) ==
               static_cast<ssize_t>(hex.size());
        }
        return ok;
      },
      options);
  if (!source_error.empty()) {
    throw IoError(fmt::format("{}: not written: {}", path.string(), source_error));
  }
  if (written.ok()) return;
  if (std::string_view(written.step) == "target") refuse_target(path);
  throw IoError(fmt::format("{}: cannot write ({} {}: {})", path.string(), written.step,
                            written.temp.string(), support::errno_text(written.err)));
}

namespace {

using Fail = std::function<void(const std::string&)>;

/// Reads the header text and, with `with_data`, the data section into `file.data`;
/// `*data_offset` and `*data_bytes` say where the data section lies in the file.
std::string read_header_and_data(const std::filesystem::path& path, const Fail& fail,
                                 SafetensorsFile& file, bool with_data, std::uint64_t* data_offset,
                                 std::uint64_t* data_bytes) {
  support::UniqueFd fd(support::open_retry(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) fail(fmt::format("cannot open: {}", support::errno_text(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(fmt::format("cannot stat: {}", support::errno_text(errno)));
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) fail(fmt::format("file is too short ({} bytes) to hold the header length", size));

  unsigned char length_bytes[8];
  if (!support::read_exact(fd.get(), reinterpret_cast<char*>(length_bytes), 8)) {
    fail(fmt::format("cannot read: {}", support::errno_text(errno)));
  }
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | length_bytes[i];
  if (header_len > kMaxHeaderBytes) {
    fail(fmt::format("header length {} is above the limit of {} bytes", header_len,
                     kMaxHeaderBytes));
  }
  if (header_len > size - 8) {
    fail(
        fmt::format("header length {} runs past the end of the file ({} bytes)", header_len, size));
  }
  std::string header(header_len, '\0');
  *data_offset = 8 + header_len;
  *data_bytes = size - 8 - header_len;
  if (with_data) file.data.resize(*data_bytes);
  if (!support::read_exact(fd.get(), header.data(), header.size()) ||
      !support::read_exact(fd.get(), file.data.data(), file.data.size())) {
    fail(fmt::format("cannot read: {}", support::errno_text(errno)));
  }

  return header;
}

/// One tensor's entry of the header, checked against the data section.
SafetensorsFile::Entry read_entry(const std::string& name, const JsonValue& value,
                                  std::uint64_t data_bytes, const Fail& fail) {
  auto bad = [&](const std::string& what) { fail(fmt::format("tensor '{}': {}", name, what)); };
  if (name.empty()) fail("header: a tensor has an empty name");
  if (value.kind != JsonValue::Kind::kObject) bad("entry is not an object");
  const JsonValue* dtype = nullptr;
  const JsonValue* shape = nullptr;
  const JsonValue* offsets = nullptr;
  for (const auto& [key, v] : value.object) {
    if (key == "dtype") {
      dtype = &v;
    } else if (key == "shape") {
      shape = &v;
    } else if (key == "data_offsets") {
      offsets = &v;
    } else {
      bad(fmt::format("unexpected key \"{}\"", key));
    }
  }
  if (!dtype || !shape || !offsets) bad("needs \"dtype\", \"shape\" and \"data_offsets\"");
  if (dtype->kind != JsonValue::Kind::kString) bad("dtype is not a string");
  SafetensorsFile::Entry entry;
  entry.dtype = dtype->string;
  int elem = dtype_bytes(entry.dtype);
  if (elem == 0) bad(fmt::format("unknown dtype \"{}\"", entry.dtype));
  if (shape->kind != JsonValue::Kind::kArray) bad("shape is not an array");
  if (shape->array.size() > kMaxDims) {
    bad(fmt::format("shape has {} dimensions, above the limit of {}", shape->array.size(),
                    kMaxDims));
  }
  for (const JsonValue& d : shape->array) {
    if (d.kind != JsonValue::Kind::kInteger || d.integer < 0) {
      bad("shape holds something other than a non-negative integer");
    }
    entry.shape.push_back(d.integer);
  }
  if (offsets->kind != JsonValue::Kind::kArray || offsets->array.size() != 2 ||
      offsets->array[0].kind != JsonValue::Kind::kInteger ||
      offsets->array[1].kind != JsonValue::Kind::kInteger || offsets->array[0].integer < 0 ||
      offsets->array[1].integer < 0) {
    bad("data_offsets is not a pair of non-negative integers");
  }
  entry.begin = static_cast<std::uint64_t>(offsets->array[0].integer);
  entry.end = static_cast<std::uint64_t>(offsets->array[1].integer);
  if (entry.end < entry.begin) {
    bad(fmt::format("data_offsets [{}, {}] end before they begin", entry.begin, entry.end));
  }
  if (entry.end > data_bytes) {
    bad(fmt::format("data_offsets [{}, {}] run past the data section ({} bytes)", entry.begin,
                    entry.end, data_bytes));
  }
  std::uint64_t expected = 0;
  if (!shape_bytes(entry.shape, elem, &expected)) {
    bad(fmt::format("shape {} overflows", shape_text(entry.shape)));
  }
  if (expected != entry.end - entry.begin) {
    bad(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}",
                    shape_text(entry.shape), entry.dtype, expected, entry.begin, entry.end,
                    entry.end - entry.begin));
  }
  return entry;
}

/// The tensors must tile the data section: no overlap, no gap, nothing left over.
void check_tiling(std::vector<std::tuple<std::uint64_t, std::uint64_t, std::string>> ranges,
                  std::uint64_t data_bytes, const Fail& fail) {
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t covered = 0;
  for (const auto& [begin, end, name] : ranges) {
    if (begin < covered) {
      fail(fmt::format("tensor '{}': data_offsets [{}, {}] overlap another tensor", name, begin,
                       end));
    }
    if (begin > covered) {
      fail(fmt::format("bytes [{}, {}) of the data section belong to no tensor", covered, begin));
    }
    covered = end;
  }
  if (covered != data_bytes) {
    fail(
        fmt::format("bytes [{}, {}) of the data section belong to no tensor", covered, data_bytes));
  }
}

}  // namespace

namespace {

/// Checks (with `with_data`) the file against its checksum entry and takes the entry out of
/// `file.metadata`: kChecksumKey over the length field, the header with the value zeroed and
/// the data; or an older file's kDataChecksumKey over the data alone.
void check_checksum(const std::string& header, bool with_data, const Fail& fail,
                    SafetensorsFile& file) {
  auto mismatch = [&](const char* key, const std::string& recorded, const std::string& actual,
                      const char* what) {
    fail(
        fmt::format("{} does not match its checksum ({} {}, it hashes to {}): the file was "
                    "changed or damaged after it was written",
                    what, key, recorded, actual));
  };
  if (auto sum = file.metadata.find(kChecksumKey); sum != file.metadata.end()) {
    file.checksum = sum->second;
    file.metadata.erase(sum);
    const std::size_t at = checksum_value_at(header);
    if (file.checksum.size() != kDigestChars || at == std::string::npos ||
        header.compare(at, kDigestChars, file.checksum) != 0) {
      fail(fmt::format("{} '{}' is not the 16 hex digits where fusedopt writes them", kChecksumKey,
                       file.checksum));
    }
    if (!with_data) return;
    std::string head = length_field(header.size()) + header;
    head.replace(8 + at, kDigestChars, kDigestChars, '0');
    Digest digest;
    digest.add(head.data(), head.size());
    digest.add(file.data.data(), file.data.size());
    const std::string actual = digest.hex();
    if (actual != file.checksum) mismatch(kChecksumKey, file.checksum, actual, "the file");
    file.data_checked = true;
  }
  if (auto sum = file.metadata.find(kDataChecksumKey); sum != file.metadata.end()) {
    const std::string recorded = sum->second;
    file.metadata.erase(sum);
    if (!with_data) return;
    const std::string actual = hex64(XXH3_64bits(file.data.data(), file.data.size()));
    if (recorded != actual) mismatch(kDataChecksumKey, recorded, actual, "the data section");
    file.data_checked = true;
  }
}

/// read_safetensors, or with `with_data` false the header alone (data_checked stays false).
SafetensorsFile read_file(const std::filesystem::path& path, bool with_data,
                          std::uint64_t* data_offset) {
  const Fail fail = [&](const std::string& what) { throw IoError(path.string() + ": " + what); };
  SafetensorsFile file;
  std::uint64_t data_bytes = 0;
  const std::string header =
      read_header_and_data(path, fail, file, with_data, data_offset, &data_bytes);
  JsonValue root;
  try {
    root = parse_json(header);
  } catch (const Error& e) {
    fail(std::string("header: ") + e.what());
  }
  if (root.kind != JsonValue::Kind::kObject) fail("header: not a JSON object");
  const std::size_t count = root.object.size();
  if (count > kMaxTensors + 1) {  // + 1: __metadata__
    fail(fmt::format("header: {} entries, above the limit of {} tensors", count, kMaxTensors));
  }

  // (begin, end, name) of every tensor, to check that they tile the data section.
  std::vector<std::tuple<std::uint64_t, std::uint64_t, std::string>> ranges;
  for (auto& [name, value] : root.object) {
    if (name == kMetadataKey) {
      if (value.kind != JsonValue::Kind::kObject) fail("header: __metadata__ is not an object");
      for (auto& [key, v] : value.object) {
        if (v.kind != JsonValue::Kind::kString) {
          fail(fmt::format("header: metadata value for '{}' is not a string", key));
        }
        file.metadata.emplace(key, std::move(v.string));
      }
      continue;
    }
    SafetensorsFile::Entry entry = read_entry(name, value, data_bytes, fail);
    ranges.emplace_back(entry.begin, entry.end, name);
    // The JSON parser already rejected duplicate keys, so this never replaces an entry.
    file.tensors.emplace(name, std::move(entry));
  }

  check_tiling(std::move(ranges), data_bytes, fail);
  check_checksum(header, with_data, fail, file);
  return file;
}

}  // namespace

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  std::uint64_t data_offset = 0;
  return read_file(path, true, &data_offset);
}

SafetensorsFile read_safetensors_header(const std::filesystem::path& path,
                                        std::uint64_t* data_offset) {
  return read_file(path, false, data_offset);
}

}  // namespace fusedopt::io
