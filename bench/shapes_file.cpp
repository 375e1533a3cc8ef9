// read_shapes_file (shapes_file.hpp): a strict reader of the JSON a shapes file is made of
// (objects, arrays, strings, numbers, true, false, null), then the workload it describes.
#include "shapes_file.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "fusedopt/dtype.hpp"

namespace fusedopt::bench {

namespace {

/// One JSON value, with where it began (for errors).
struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  double number = 0;
  bool boolean = false;
  std::string text;
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;  ///< in the file's order
  int line = 1, column = 1;

  const Value* member(const std::string& key) const {
    for (const auto& [k, v] : members) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

class Reader {
 public:
  Reader(std::string text, std::string path) : s_(std::move(text)), path_(std::move(path)) {}

  Value document() {
    Value v = value();
    space();
    if (at_ < s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

  [[noreturn]] void fail(const std::string& what, int line = 0, int column = 0) const {
    std::ostringstream msg;
    msg << path_ << ":" << (line ? line : line_) << ":" << (line ? column : column_)
        << ": error: " << what;
    throw std::runtime_error(msg.str());
  }

 private:
  void space() {
    while (at_ < s_.size() &&
           (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) {
      advance();
    }
  }
  void advance() {
    if (s_[at_] == '\n') {
      ++line_;
      column_ = 1;
    } else {
      ++column_;
    }
    ++at_;
  }
  void expect(char c) {
    space();
    if (at_ >= s_.size() || s_[at_] != c) fail(std::string("expected '") + c + "'");
    advance();
  }
  bool word(const char* w) {
    const std::string x(w);
    if (s_.compare(at_, x.size(), x) != 0) return false;
    for (std::size_t i = 0; i < x.size(); ++i) advance();
    return true;
  }

  Value value() {
    if (++depth_ > 64) fail("nested too deeply");
    space();
    if (at_ >= s_.size()) fail("unexpected end of file");
    Value v;
    v.line = line_;
    v.column = column_;
    const char c = s_[at_];
    if (c == '{') {
      v.kind = Value::Kind::Object;
      advance();
      space();
      if (at_ < s_.size() && s_[at_] == '}') {
        advance();
      } else {
        do {
          space();
          if (at_ >= s_.size() || s_[at_] != '"') fail("expected a string key");
          std::string key = string();
          expect(':');
          v.members.emplace_back(std::move(key), value());
          space();
        } while (at_ < s_.size() && s_[at_] == ',' && (advance(), true));
        expect('}');
      }
    } else if (c == '[') {
      v.kind = Value::Kind::Array;
      advance();
      space();
      if (at_ < s_.size() && s_[at_] == ']') {
        advance();
      } else {
        do {
          v.items.push_back(value());
          space();
        } while (at_ < s_.size() && s_[at_] == ',' && (advance(), true));
        expect(']');
      }
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.text = string();
    } else if (word("true") || word("false")) {
      v.kind = Value::Kind::Bool;
      v.boolean = s_[at_ - 1] == 'e' && s_[at_ - 2] == 'u';
    } else if (word("null")) {
      v.kind = Value::Kind::Null;
    } else {
      v.kind = Value::Kind::Number;
      v.number = number();
    }
    --depth_;
    return v;
  }

  std::string string() {
    advance();  // the opening quote
    std::string out;
    while (true) {
      if (at_ >= s_.size()) fail("unterminated string");
      const char c = s_[at_];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character in a string");
      if (c == '\\') {
        advance();
        if (at_ >= s_.size()) fail("unterminated string");
        const char e = s_[at_];
        const std::string plain = "\"\\/bfnrt";
        const std::string meant = "\"\\/\b\f\n\r\t";
        const std::size_t k = plain.find(e);
        if (k == std::string::npos) fail("an escape fusedopt-bench does not read (\\u...)");
        out += meant[k];
      } else {
        out += c;
      }
      advance();
    }
    advance();  // the closing quote
    return out;
  }

  double number() {
    const std::size_t begin = at_;
    while (at_ < s_.size() && std::string("+-0123456789.eE").find(s_[at_]) != std::string::npos) {
      advance();
    }
    const std::string text = s_.substr(begin, at_ - begin);
    char* end = nullptr;
    const double x = text.empty() ? 0 : std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(x)) {
      fail("expected a value (object, array, string, number, true, false or null)");
    }
    return x;
  }

  std::string s_, path_;
  std::size_t at_ = 0;
  int line_ = 1, column_ = 1, depth_ = 0;
};

std::optional<DType> dtype_named(const std::string& name) {
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    if (name == to_string(d)) return d;
  }
  return dtype_of_safetensors_name(name);
}

}  // namespace

Workload read_shapes_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": error: cannot open the shapes file");
  std::stringstream text;
  text << in.rdbuf();
  Reader reader(text.str(), path);
  const Value doc = reader.document();
  Workload w;
  w.name = path;
  const Value* tensors = &doc;
  if (doc.kind == Value::Kind::Object) {
    if (const Value* name = doc.member("name"); name && name->kind == Value::Kind::String) {
      w.name = name->text;
    }
    tensors = doc.member("tensors");
    if (!tensors) reader.fail("the object has no \"tensors\" array", doc.line, doc.column);
  }
  if (tensors->kind != Value::Kind::Array || tensors->items.empty()) {
    reader.fail("expected a non-empty array of tensors", tensors->line, tensors->column);
  }
  for (const Value& t : tensors->items) {
    if (t.kind != Value::Kind::Object) reader.fail("a tensor must be an object", t.line, t.column);
    const Value* shape = t.member("shape");
    if (!shape || shape->kind != Value::Kind::Array) {
      reader.fail("a tensor needs \"shape\": an array of dimensions", t.line, t.column);
    }
    std::vector<std::int64_t> dims;
    std::int64_t n = 1;
    for (const Value& d : shape->items) {
      if (d.kind != Value::Kind::Number || d.number < 1 || d.number > 1e12 ||
          d.number != std::floor(d.number)) {
        reader.fail("a dimension must be a whole number from 1 to 10^12", d.line, d.column);
      }
      dims.push_back(static_cast<std::int64_t>(d.number));
      n *= dims.back();
      if (n > (std::int64_t{1} << 40)) reader.fail("the tensor is too large", d.line, d.column);
    }
    DType dtype = DType::F32;
    if (const Value* d = t.member("dtype")) {
      const std::optional<DType> named =
          d->kind == Value::Kind::String ? dtype_named(d->text) : std::nullopt;
      if (!named) reader.fail("dtype must be one of fp32, fp16, bf16, fp64", d->line, d->column);
      dtype = *named;
    }
    const Value* name = t.member("name");
    w.names.push_back(name && name->kind == Value::Kind::String
                          ? name->text
                          : "tensor" + std::to_string(w.sizes.size()));
    w.sizes.push_back(shape->items.empty() ? 1 : n);
    w.shapes.push_back(dims);
    w.dtypes.push_back(dtype);
  }
  return w;
}

}  // namespace fusedopt::bench
