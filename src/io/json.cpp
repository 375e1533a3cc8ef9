// Strict JSON for safetensors headers; see json.hpp for what is accepted.
#include "io/json.hpp"

#include <fmt/format.h>

#include <unordered_set>

#include "fusedopt/error.hpp"
#include "support/text.hpp"

namespace fusedopt::io {
namespace {

// Headers are flat (object -> object -> array); the limit only stops a hostile file from
// exhausting the stack through recursion.
constexpr int kMaxDepth = 64;

// Length of the UTF-8 sequence starting at s[i], or 0 if it is malformed.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  std::size_t n;
  std::uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr std::uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  JsonValue parse_document() {
    skip_whitespace();
    JsonValue v = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("unexpected data after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw IoError(fmt::format("malformed JSON at byte {}: {}", pos_, what));
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) {
      ++pos_;
    }
  }

  void expect(char c) {
    if (at_end()) fail(fmt::format("expected '{}', found the end", c));
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++pos_;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    if (at_end()) fail("expected a value, found the end");
    char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') {
      JsonValue v;
      v.kind = JsonValue::Kind::kString;
      v.string = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_integer();
    fail("expected an object, an array, a string or an integer");
  }

  JsonValue parse_object(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::kObject;
    expect('{');
    skip_whitespace();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return v;
    }
    std::unordered_set<std::string> keys;
    for (;;) {
      skip_whitespace();
      std::size_t key_pos = pos_;
      if (at_end() || peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      // A hash set keeps duplicate detection linear in the number of keys (a header holds a
      // key per tensor, hundreds of thousands in a large checkpoint).
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        fail(fmt::format("duplicate key \"{}\"", key));
      }
      skip_whitespace();
      expect(':');
      skip_whitespace();
      v.object.emplace_back(std::move(key), parse_value(depth + 1));
      skip_whitespace();
      if (at_end()) fail("expected ',' or '}', found the end");
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      expect(',');
    }
  }

  JsonValue parse_array(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::kArray;
    expect('[');
    skip_whitespace();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_whitespace();
      v.array.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (at_end()) fail("expected ',' or ']', found the end");
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      expect(',');
    }
  }

  JsonValue parse_integer() {
    JsonValue v;
    v.kind = JsonValue::Kind::kInteger;
    bool negative = false;
    if (peek() == '-') {
      negative = true;
      ++pos_;
    }
    if (at_end() || peek() < '0' || peek() > '9') fail("expected a digit");
    if (peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      fail("leading zeros are not allowed");
    }
    // Accumulate as a negative number so that INT64_MIN fits.
    std::int64_t value = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      int digit = peek() - '0';
      if (__builtin_mul_overflow(value, 10, &value) ||
          __builtin_sub_overflow(value, digit, &value)) {
        fail("integer out of range");
      }
      ++pos_;
    }
    if (!at_end() && (peek() == '.' || peek() == 'e' || peek() == 'E')) {
      fail("only integers are allowed");
    }
    if (!negative) {
      if (value == INT64_MIN) fail("integer out of range");
      value = -value;
    }
    v.integer = value;
    return v;
  }

  std::uint32_t parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    std::uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      char h = text_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') {
        cp |= static_cast<std::uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        cp |= static_cast<std::uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        cp |= static_cast<std::uint32_t>(h - 'A' + 10);
      } else {
        --pos_;
        fail("bad hex digit in \\u escape");
      }
    }
    return cp;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(peek());
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("unescaped control character in a string");
      if (c == '\\') {
        ++pos_;
        if (at_end()) fail("unterminated escape");
        char e = text_[pos_++];
        switch (e) {
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case '/':
            out += '/';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'n':
            out += '\n';
            break;
          case 'r':
            out += '\r';
            break;
          case 't':
            out += '\t';
            break;
          case 'u': {
            std::uint32_t cp = parse_hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
                fail("high surrogate not followed by a low surrogate");
              }
              pos_ += 2;
              std::uint32_t low = parse_hex4();
              if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate not followed by a low one");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            append_utf8(out, cp);
            break;
          }
          default:
            --pos_;
            fail("unknown escape");
        }
        continue;
      }
      std::size_t n = utf8_sequence_length(text_, pos_);
      if (n == 0) fail("invalid UTF-8 in a string");
      out.append(text_.substr(pos_, n));
      pos_ += n;
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

JsonValue parse_json(std::string_view text) { return Parser(text).parse_document(); }

bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view s) {
  if (!is_valid_utf8(s)) throw IoError("string is not valid UTF-8");
  support::append_json_string(out, s, false);  // UTF-8 passes through: JSON allows it
}

}  // namespace fusedopt::io
