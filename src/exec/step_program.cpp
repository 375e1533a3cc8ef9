// compile_step and describe (see step_program.hpp).
#include "exec/step_program.hpp"

#include <algorithm>

namespace fusedopt::runtime {

StepProgram compile_step(int passes, bool scaled, bool fold_check, bool extended,
                         const std::vector<int>& stages, const std::vector<int>& matrix_stages) {
  using K = StepOp::Kind;
  const bool folded = scaled && fold_check && passes > 0;
  StepProgram p;
  if (extended) p.push_back({K::Begin});
  if (scaled && !folded) {
    // Every binding is checked before any is written: a non-finite gradient anywhere
    // leaves every tensor untouched.
    p.push_back({K::CheckGrads});
    p.push_back({K::CheckHook});
    p.push_back({K::SkipIf});
  }
  for (int pass = 0; pass < passes; ++pass) {
    p.push_back({K::Reduce, pass, folded && pass == 0});
    const int n = static_cast<std::size_t>(pass) < stages.size() ? stages[pass] : 1;
    if (n <= 1) {
      p.push_back({K::Finalize, pass});
      // The hook before the skip: the grad check's count is a global slot (combined by max),
      // so every rank sees the same verdict and skips the same steps.
      p.push_back({K::Hook, pass});
    } else {
      // Pieces: the sums that span them combined before anything reads them.
      p.push_back({K::Finalize, pass, false, 1});
      p.push_back({K::Hook, pass});
      p.push_back({K::Finalize, pass, false, 2});
      if (n > 2) {
        p.push_back({K::Hook, pass, false, 1});
        p.push_back({K::Finalize, pass, false, 3});
      }
    }
    if (folded && pass == 0) p.push_back({K::SkipIf});
    if (std::find(matrix_stages.begin(), matrix_stages.end(), pass) != matrix_stages.end()) {
      p.push_back({K::Stage, pass});
    }
  }
  p.push_back({K::Update});
  p.push_back({K::End});
  if (extended) p.push_back({K::Publish});
  return p;
}

std::string describe(const StepProgram& program) {
  std::string out;
  for (const StepOp& op : program) {
    if (!out.empty()) out += ", ";
    switch (op.kind) {
      case StepOp::Kind::Begin:
        out += "begin";
        break;
      case StepOp::Kind::CheckGrads:
        out += "check grads";
        break;
      case StepOp::Kind::CheckHook:
        out += "hook check";
        break;
      case StepOp::Kind::SkipIf:
        out += "skip if";
        break;
      case StepOp::Kind::Reduce:
        out += "reduce " + std::to_string(op.pass) + (op.check_grads ? " (+check)" : "");
        break;
      case StepOp::Kind::Finalize:
        out += "finalize " + std::to_string(op.pass) +
               (op.stage > 0 ? " (stage " + std::to_string(op.stage) + ")" : "");
        break;
      case StepOp::Kind::Stage:
        out += "stage " + std::to_string(op.pass);
        break;
      case StepOp::Kind::Hook:
        out += "hook " + std::to_string(op.pass) + (op.stage > 0 ? " (matrices)" : "");
        break;
      case StepOp::Kind::Update:
        out += "update";
        break;
      case StepOp::Kind::End:
        out += "end";
        break;
      case StepOp::Kind::Publish:
        out += "publish";
        break;
    }
  }
  return out;
}

}  // namespace fusedopt::runtime
