// A rule of a chosen size: exactly `hypers` hypers, `tensors` state and output tensors,
// `statements` statements, `temporaries` temporary names, `operations` operators and
// function calls of which `uniform_operations` on hypers and constants only. The default
// is the largest rule the limits of lang/limits.hpp allow; one count + 1 is one past it.
#pragma once

#include <string>

namespace fusedopt::testing {

struct RuleSize {
  int hypers = 256;
  int tensors = 32;  // tensors - 1 states and one output
  int statements = 1024;
  int temporaries = 512;
  int operations = 2048;
  int uniform_operations = 1024;
};

inline std::string sized_rule(const RuleSize& z) {
  const int states = z.tensors - 1;
  const int u_names = z.temporaries / 2;
  const int t_names = z.temporaries - u_names;
  auto u = [&](int k) { return "u" + std::to_string(k % u_names); };
  auto t = [&](int k) { return "t" + std::to_string(k % t_names); };
  auto h = [&](int k) { return "h" + std::to_string(k % z.hypers); };
  auto s = [&](int k) { return "s" + std::to_string(k % states); };
  std::string r = "param p\ngrad g\n";
  for (int i = 0; i < z.hypers; ++i) r += "hyper h" + std::to_string(i) + " = 0.001\n";
  for (int i = 0; i < states; ++i) r += "state s" + std::to_string(i) + " = 0\n";
  r += "output o\n";
  int stmts = 0;
  int ops = 0;
  // Uniform: a chain of u's, two operations a statement (one more in front when odd).
  const bool odd = z.uniform_operations % 2 != 0;
  r += odd ? "u0 = h0 * 0.5\n" : "u0 = h0\n";
  stmts += 1;
  ops += odd ? 1 : 0;
  const int u_stmts = z.uniform_operations / 2;
  for (int k = 1; k <= u_stmts; ++k) {
    r += u(k) + " = " + u(k - 1) + " * 0.5 + " + h(k) + "\n";
  }
  stmts += u_stmts;
  ops += 2 * u_stmts;
  // The states and the output.
  for (int i = 0; i < states; ++i) r += s(i) + " = " + s(i) + " * 0.9 + g\n";
  r += "o = p * 2\nt0 = g\n";
  stmts += states + 2;
  ops += 2 * states + 1;
  // The element-wise chain spreads the operations left over its statements (at least one
  // each); the last statement, `p = p - u * t`, has two.
  const int chain = z.statements - stmts - 1;
  const int spread = z.operations - ops - 2;
  for (int k = 1; k <= chain; ++k) {
    const int n = spread / chain + (k <= spread % chain ? 1 : 0);
    std::string line = t(k) + " = " + t(k - 1);
    for (int j = 0; j < n; ++j) line += " + " + s(k + j);
    r += line + "\n";
  }
  r += "p = p - " + u(u_stmts) + " * " + t(chain) + "\n";
  return r;
}

}  // namespace fusedopt::testing
