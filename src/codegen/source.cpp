// Assembles whole translation units: the prelude, the ABI, the body and the skeleton of
// the target (templates/kernels/, its parts pasted where it includes them), with the #line
// markers resolved.
#include <fmt/format.h>

#include <string_view>

#include "codegen/codegen.hpp"
#include "codegen/writer.hpp"
#include "embedded.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::codegen {

namespace {

/// `skeleton` with each line `#include "NAME"` replaced by the embedded kernels/NAME (the
/// skeleton's parts: cuda_staging.cuh, host_reduce.hpp, ...), so that the translation unit
/// includes no header: NVRTC, the host compiler and the emulator compile it alike, and the
/// cache key (which hashes the source) covers the parts. One level: parts include nothing.
std::string paste_parts(const std::string& skeleton) {
  const std::string directive = "#include \"";
  std::string out;
  out.reserve(skeleton.size() * 2);
  std::size_t pos = 0;
  while (pos < skeleton.size()) {
    std::size_t end = skeleton.find('\n', pos);
    end = end == std::string::npos ? skeleton.size() : end + 1;
    const std::string_view line(skeleton.data() + pos, end - pos);
    const std::size_t close = line.find('"', directive.size());
    if (line.substr(0, directive.size()) == directive && close != std::string_view::npos) {
      // embedded_file throws InternalError naming a part that is not embedded.
      out.append(embedded_file(
          "kernels/" + std::string(line.substr(directive.size(), close - directive.size()))));
    } else {
      out.append(line);
    }
    pos = end;
  }
  return out;
}

}  // namespace

std::string source_file_name(const KernelBody& body, const Target& target) {
  return "fusedopt_" + line_file_name(body.name) + (target.cuda_source() ? ".cu" : ".cpp");
}

std::string generate_source(const KernelBody& body, const Target& target) {
  std::string skeleton(
      embedded_file(target.cuda_source() ? "kernels/cuda_kernel.cuh" : "kernels/host_kernel.hpp"));
  // The skeleton's "#ifndef FO_GENERATED" block only serves compiling it on its own.
  const std::string standalone = "#ifndef FO_GENERATED\n";
  if (std::size_t a = skeleton.find(standalone); a != std::string::npos) {
    std::size_t b = skeleton.find("#endif\n", a);
    if (b == std::string::npos)
      throw InternalError("kernel skeleton: unterminated FO_GENERATED block");
    skeleton.erase(a, b + 7 - a);
  }
  skeleton = paste_parts(skeleton);
  if (body.f64 && target.cuda_source()) {
    // An fp64 binding's staging of double roles, after the skeleton's staging types and
    // before the code that uses them (only fp64 sources hold it).
    const std::string anchor = "// The generated FO_UPDATE_STAGE(LOAD, DECL)";
    const std::size_t at = skeleton.find(anchor);
    if (at == std::string::npos) throw InternalError("kernel skeleton: no '" + anchor + "'");
    skeleton.insert(at, std::string(embedded_file("kernels/f64_cuda.cuh")));
  }
  std::string text;
  text += "// fusedopt kernel '" + sanitize_comment(body.name) + "' for " + target.str() + "\n";
  text += "#define FO_GENERATED 1\n";
  text += embedded_file("kernels/prelude.h");
  text += embedded_file("kernels/abi.h");
  if (body.f64) text += embedded_file("kernels/f64.h");
  text += body.code;
  text += embedded_file("kernels/factored.h");
  text += embedded_file("kernels/quant.h");
  if (!target.cuda_source()) {
    text += embedded_file("kernels/quant_avx512.h");
    text += embedded_file("kernels/quant_avx2.h");
  }
  text += skeleton;
  // Resolve the restore markers now that absolute line numbers are known.
  const std::string file = source_file_name(body, target);
  std::string out;
  out.reserve(text.size() + 256);
  int line_no = 1;
  std::size_t pos = 0;
  const std::string marker = kRestoreLineMarker;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view ln(text.data() + pos, end - pos);
    if (ln == marker) {
      out += fmt::format("#line {} \"{}\"", line_no + 1, file);
    } else {
      out.append(ln);
    }
    out += '\n';
    ++line_no;
    pos = end + 1;
  }
  return out;
}

}  // namespace fusedopt::codegen
