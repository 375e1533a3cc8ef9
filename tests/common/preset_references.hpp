// The float64 references of the preset tests (test_presets.cpp): each optimizer's update
// written by hand from its reference implementation, the references' default hypers, and
// 16-bit storage formats (round to nearest even) written independently of the library.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/close.hpp"
#include "fusedopt/dtype.hpp"

namespace fusedopt::testing {

using fusedopt::DType;

// ---------------------------------------------------------------------------------------
// Hypers: the reference's defaults, written out here (not read from the rules).

using Hypers = std::map<std::string, double>;

/// `base` with `changes` applied; a name `base` lacks is a bug in this file.
inline Hypers with(Hypers base, const Hypers& changes) {
  for (const auto& [name, value] : changes) {
    if (!base.count(name)) throw std::logic_error("no hyper '" + name + "' to change");
    base[name] = value;
  }
  return base;
}

inline std::string describe(const Hypers& h) {
  std::string out;
  for (const auto& [name, value] : h)
    out += (out.empty() ? "" : ", ") + name + "=" + fmt_double(value);
  return out;
}

/// A hyper as the kernel sees it: hypers are passed as fp32, so the reference uses the
/// same (rounded) value and the comparison measures only the arithmetic.
inline double hyper(const Hypers& h, const char* name) {
  return static_cast<double>(static_cast<float>(h.at(name)));
}

inline const Hypers kSgdDefaults = {{"lr", 1e-3},        {"momentum", 0}, {"dampening", 0},
                                    {"weight_decay", 0}, {"nesterov", 0}, {"maximize", 0}};
inline const Hypers kAdamDefaults = {{"lr", 1e-3},  {"beta1", 0.9},      {"beta2", 0.999},
                                     {"eps", 1e-8}, {"weight_decay", 0}, {"maximize", 0}};
inline const Hypers kAdamWDefaults = {{"lr", 1e-3},  {"beta1", 0.9},         {"beta2", 0.999},
                                      {"eps", 1e-8}, {"weight_decay", 1e-2}, {"maximize", 0}};
inline const Hypers kAdagradDefaults = {{"lr", 1e-2},        {"lr_decay", 0},
                                        {"weight_decay", 0}, {"initial_accumulator_value", 0},
                                        {"eps", 1e-10},      {"maximize", 0}};
inline const Hypers kRmspropDefaults = {{"lr", 1e-2},        {"alpha", 0.99}, {"eps", 1e-8},
                                        {"weight_decay", 0}, {"momentum", 0}, {"centered", 0},
                                        {"maximize", 0}};
inline const Hypers kAdamaxDefaults = {{"lr", 2e-3},  {"beta1", 0.9},      {"beta2", 0.999},
                                       {"eps", 1e-8}, {"weight_decay", 0}, {"maximize", 0}};
inline const Hypers kNadamDefaults = {{"lr", 2e-3},
                                      {"beta1", 0.9},
                                      {"beta2", 0.999},
                                      {"eps", 1e-8},
                                      {"weight_decay", 0},
                                      {"momentum_decay", 4e-3},
                                      {"decoupled_weight_decay", 0},
                                      {"maximize", 0}};
inline const Hypers kAdoptDefaults = {
    {"lr", 1e-3},        {"beta1", 0.9},  {"beta2", 0.9999},       {"eps", 1e-6},
    {"weight_decay", 0}, {"decouple", 0}, {"clip_exponent", 0.25}, {"maximize", 0}};
inline const Hypers kAdanDefaults = {{"lr", 1e-3},    {"beta1", 0.98}, {"beta2", 0.92},
                                     {"beta3", 0.99}, {"eps", 1e-8},   {"weight_decay", 0},
                                     {"no_prox", 0}};
inline const Hypers kLionDefaults = {
    {"lr", 1e-4}, {"beta1", 0.9}, {"beta2", 0.99}, {"weight_decay", 0}};
/// bitsandbytes' AdamW8bit and Adam8bit (one algorithm), torchao's AdamW4bit.
inline const Hypers kAdamW8bitDefaults = {
    {"lr", 1e-3}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 1e-2}};
inline const Hypers kAdam8bitDefaults = {
    {"lr", 1e-3}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0}};
inline const Hypers kAdamW4bitDefaults = kAdamW8bitDefaults;
inline const Hypers kRadamDefaults = {{"lr", 1e-3},        {"beta1", 0.9},
                                      {"beta2", 0.999},    {"eps", 1e-8},
                                      {"weight_decay", 0}, {"decoupled_weight_decay", 0},
                                      {"maximize", 0}};
inline const Hypers kAdadeltaDefaults = {
    {"lr", 1.0}, {"rho", 0.9}, {"eps", 1e-6}, {"weight_decay", 0}, {"maximize", 0}};
inline const Hypers kRpropDefaults = {{"lr", 1e-2},          {"etaminus", 0.5},
                                      {"etaplus", 1.2},      {"step_size_min", 1e-6},
                                      {"step_size_max", 50}, {"maximize", 0}};
inline const Hypers kAsgdDefaults = {{"lr", 1e-2}, {"lambd", 1e-4},     {"alpha", 0.75},
                                     {"t0", 1e6},  {"weight_decay", 0}, {"maximize", 0}};
// BertAdam's lr is `required` (no default); the preset picks 1e-3.
inline const Hypers kBertAdamDefaults = {
    {"lr", 1e-3}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-6}, {"weight_decay", 1e-2}};

// ---------------------------------------------------------------------------------------
// The float64 references. Each updates one element: `p` and the states `s` (in the rule's
// declaration order) in place, for the 1-based step `t`. The return value is extra
// absolute slack the param may need for this step (only Lion's sign needs any).

using RefStep = std::function<double(double t, double& p, double g, double* s)>;

// torch.optim.SGD, _single_tensor_sgd.
inline RefStep sgd_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), momentum = hyper(h, "momentum");
  const double dampening = hyper(h, "dampening"), wd = hyper(h, "weight_decay");
  const bool nesterov = hyper(h, "nesterov") != 0, maximize = hyper(h, "maximize") != 0;
  return [=](double t, double& p, double g, double* s) {
    double& buf = s[0];
    double grad = maximize ? -g : g;
    if (wd != 0) grad = grad + wd * p;
    if (momentum != 0) {
      if (t == 1) {
        buf = grad;  // torch: buf = torch.clone(grad) when there is no buffer yet
      } else {
        buf = buf * momentum + (1 - dampening) * grad;
      }
      grad = nesterov ? grad + momentum * buf : buf;
    }
    p = p - lr * grad;
    return 0.0;
  };
}

/// The Adam family's first lines in torch (Adam, AdamW, RAdam): the weight decay (decoupled:
/// p shrinks; else it is added to the gradient), then the first and second moments.
inline void adam_moments(double& p, double grad, double& m, double& v, double lr, double wd,
                         bool decoupled, double beta1, double beta2) {
  if (wd != 0) {
    if (decoupled) {
      p = p * (1 - lr * wd);
    } else {
      grad = grad + wd * p;
    }
  }
  m = beta1 * m + (1 - beta1) * grad;
  v = beta2 * v + (1 - beta2) * grad * grad;
}

// torch.optim.Adam / AdamW, _single_tensor_adam: L2 (Adam) or decoupled (AdamW) weight
// decay, optionally AMSGrad (states m, v, max_v).
inline RefStep adam_reference(const Hypers& h, bool decoupled, bool amsgrad) {
  const double lr = hyper(h, "lr"), beta1 = hyper(h, "beta1"), beta2 = hyper(h, "beta2");
  const double eps = hyper(h, "eps"), wd = hyper(h, "weight_decay");
  const bool maximize = hyper(h, "maximize") != 0;
  return [=](double t, double& p, double g, double* s) {
    double& m = s[0];
    double& v = s[1];
    adam_moments(p, maximize ? -g : g, m, v, lr, wd, decoupled, beta1, beta2);
    const double bias_correction1 = 1 - std::pow(beta1, t);
    const double bias_correction2 = 1 - std::pow(beta2, t);
    double second = v;
    if (amsgrad) {
      s[2] = std::max(s[2], v);
      second = s[2];
    }
    const double denom = std::sqrt(second) / std::sqrt(bias_correction2) + eps;
    p = p - (lr / bias_correction1) * m / denom;
    return 0.0;
  };
}

// torch.optim.Adagrad, _single_tensor_adagrad (dense).
inline RefStep adagrad_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), lr_decay = hyper(h, "lr_decay");
  const double wd = hyper(h, "weight_decay"), eps = hyper(h, "eps");
  const bool maximize = hyper(h, "maximize") != 0;
  return [=](double t, double& p, double g, double* s) {
    double& sum = s[0];
    double grad = maximize ? -g : g;
    if (wd != 0) grad = grad + wd * p;
    const double clr = lr / (1 + (t - 1) * lr_decay);
    sum = sum + grad * grad;
    p = p - clr * grad / (std::sqrt(sum) + eps);
    return 0.0;
  };
}

// torch.optim.RMSprop, _single_tensor_rmsprop (states square_avg, grad_avg, momentum_buffer).
inline RefStep rmsprop_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), alpha = hyper(h, "alpha"), eps = hyper(h, "eps");
  const double wd = hyper(h, "weight_decay"), momentum = hyper(h, "momentum");
  const bool centered = hyper(h, "centered") != 0, maximize = hyper(h, "maximize") != 0;
  return [=](double, double& p, double g, double* s) {
    double& square_avg = s[0];
    double& grad_avg = s[1];
    double& buf = s[2];
    double grad = maximize ? -g : g;
    if (wd != 0) grad = grad + wd * p;
    square_avg = alpha * square_avg + (1 - alpha) * grad * grad;
    double avg;
    if (centered) {
      grad_avg = alpha * grad_avg + (1 - alpha) * grad;
      avg = std::sqrt(square_avg - grad_avg * grad_avg);
    } else {
      avg = std::sqrt(square_avg);
    }
    avg = avg + eps;
    if (momentum > 0) {
      buf = momentum * buf + grad / avg;
      p = p - lr * buf;
    } else {
      p = p - lr * grad / avg;
    }
    return 0.0;
  };
}

// torch.optim.Adamax, _single_tensor_adamax (states m, exp_inf).
inline RefStep adamax_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), beta1 = hyper(h, "beta1"), beta2 = hyper(h, "beta2");
  const double eps = hyper(h, "eps"), wd = hyper(h, "weight_decay");
  const bool maximize = hyper(h, "maximize") != 0;
  return [=](double t, double& p, double g, double* s) {
    double& m = s[0];
    double& exp_inf = s[1];
    double grad = maximize ? -g : g;
    if (wd != 0) grad = grad + wd * p;
    m = beta1 * m + (1 - beta1) * grad;
    exp_inf = std::max(beta2 * exp_inf, std::abs(grad) + eps);
    const double clr = lr / (1 - std::pow(beta1, t));
    p = p - clr * m / exp_inf;
    return 0.0;
  };
}

// torch.optim.NAdam, _single_tensor_nadam (states m, v, mu_prod).
inline RefStep nadam_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), beta1 = hyper(h, "beta1"), beta2 = hyper(h, "beta2");
  const double eps = hyper(h, "eps"), wd = hyper(h, "weight_decay");
  const double momentum_decay = hyper(h, "momentum_decay");
  const bool decoupled = hyper(h, "decoupled_weight_decay") != 0;
  const bool maximize = hyper(h, "maximize") != 0;
  return [=](double t, double& p, double g, double* s) {
    double& m = s[0];
    double& v = s[1];
    double& mu_product = s[2];
    double grad = maximize ? -g : g;
    if (wd != 0) {
      if (decoupled) {
        p = p * (1 - lr * wd);
      } else {
        grad = grad + wd * p;
      }
    }
    const double bias_correction2 = 1 - std::pow(beta2, t);
    const double mu = beta1 * (1 - 0.5 * std::pow(0.96, t * momentum_decay));
    const double mu_next = beta1 * (1 - 0.5 * std::pow(0.96, (t + 1) * momentum_decay));
    mu_product = mu_product * mu;
    m = beta1 * m + (1 - beta1) * grad;
    v = beta2 * v + (1 - beta2) * grad * grad;
    const double denom = std::sqrt(v / bias_correction2) + eps;
    const double mu_product_next = mu_product * mu_next;
    p = p - lr * (1 - mu) / (1 - mu_product) * grad / denom;
    p = p - lr * mu_next / (1 - mu_product_next) * m / denom;
    return 0.0;
  };
}

// torch.optim.RAdam, _single_tensor_radam (states m, v).
inline RefStep radam_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), beta1 = hyper(h, "beta1"), beta2 = hyper(h, "beta2");
  const double eps = hyper(h, "eps"), wd = hyper(h, "weight_decay");
  const bool decoupled = hyper(h, "decoupled_weight_decay") != 0;
  const bool maximize = hyper(h, "maximize") != 0;
  return [=](double t, double& p, double g, double* s) {
    double& m = s[0];
    double& v = s[1];
    adam_moments(p, maximize ? -g : g, m, v, lr, wd, decoupled, beta1, beta2);
    const double bias_correction1 = 1 - std::pow(beta1, t);
    const double bias_correction2 = 1 - std::pow(beta2, t);
    const double rho_inf = 2 / (1 - beta2) - 1;
    const double rho_t = rho_inf - 2 * t * std::pow(beta2, t) / bias_correction2;
    if (rho_t > 5.0) {
      const double rect =
          std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t));
      const double adaptive_lr = std::sqrt(bias_correction2) / (std::sqrt(v) + eps);
      p = p - m / bias_correction1 * lr * adaptive_lr * rect;
    } else {
      p = p - m / bias_correction1 * lr;
    }
    return 0.0;
  };
}

// torch.optim.Adadelta, _single_tensor_adadelta (states square_avg, acc_delta).
inline RefStep adadelta_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), rho = hyper(h, "rho"), eps = hyper(h, "eps");
  const double wd = hyper(h, "weight_decay");
  const bool maximize = hyper(h, "maximize") != 0;
  return [=](double, double& p, double g, double* s) {
    double& square_avg = s[0];
    double& acc_delta = s[1];
    double grad = maximize ? -g : g;
    if (wd != 0) grad = grad + wd * p;
    square_avg = square_avg * rho + (1 - rho) * grad * grad;
    const double std = std::sqrt(square_avg + eps);
    const double delta = std::sqrt(acc_delta + eps) / std * grad;
    acc_delta = acc_delta * rho + (1 - rho) * delta * delta;
    p = p - lr * delta;
    return 0.0;
  };
}

// torch.optim.Rprop, _single_tensor_rprop (states prev, step_size).
inline RefStep rprop_reference(const Hypers& h) {
  const double etaminus = hyper(h, "etaminus"), etaplus = hyper(h, "etaplus");
  const double lo = hyper(h, "step_size_min"), hi = hyper(h, "step_size_max");
  const bool maximize = hyper(h, "maximize") != 0;
  return [=](double, double& p, double g, double* s) {
    double& prev = s[0];
    double& step_size = s[1];
    double grad = maximize ? -g : g;
    const double product = grad * prev;
    // torch: sign[sign.gt(0)] = etaplus; sign[sign.lt(0)] = etaminus; sign[sign.eq(0)] = 1
    const double factor = product > 0 ? etaplus : product < 0 ? etaminus : 1.0;
    step_size = std::min(std::max(step_size * factor, lo), hi);
    if (factor == etaminus) grad = 0;  // torch: grad[sign.eq(etaminus)] = 0
    p = p - ((grad > 0) - (grad < 0)) * step_size;
    prev = grad;
    return 0.0;
  };
}

// torch.optim.ASGD, _single_tensor_asgd without capturable (state ax; eta and mu, one per
// param in torch, are kept per element here: every element's copy is the same).
inline RefStep asgd_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), lambd = hyper(h, "lambd"), alpha = hyper(h, "alpha");
  const double t0 = hyper(h, "t0"), wd = hyper(h, "weight_decay");
  const bool maximize = hyper(h, "maximize") != 0;
  return [=](double t, double& p, double g, double* s) {
    double& ax = s[0];
    double& eta = s[1];
    double& mu = s[2];
    double grad = maximize ? -g : g;
    if (wd != 0) grad = grad + wd * p;
    p = p * (1 - lambd * eta);  // decay term
    p = p - eta * grad;
    if (mu != 1) {
      ax = ax + (p - ax) * mu;
    } else {
      ax = p;
    }
    eta = lr / std::pow(1 + lambd * lr * t, alpha);
    mu = 1 / std::max(1.0, t - t0);
    return 0.0;
  };
}

// ADOPT, the authors' _single_tensor_adopt (github.com/iShohei220/adopt): its step counter
// is t - 1 (0 on the first call, which only fills v); states m (exp_avg), v (exp_avg_sq).
// The hypers as given, not fp32-rounded as hyper() reads them: the kernel computes 1 - beta2
// in double from the double hyper, and with ADOPT's beta2 = 0.9999, fp32's 0.9999 is 1.7e-4
// off in 1 - beta2, more than the test's tolerance.
inline RefStep adopt_reference(const Hypers& h) {
  const double lr = h.at("lr"), beta1 = h.at("beta1"), beta2 = h.at("beta2");
  const double eps = h.at("eps"), wd = h.at("weight_decay");
  const bool decouple = h.at("decouple") != 0, maximize = h.at("maximize") != 0;
  const double clip_exponent = h.at("clip_exponent");
  return [=](double t, double& p, double g, double* s) {
    double& m = s[0];
    double& v = s[1];
    double grad = maximize ? -g : g;
    if (wd != 0 && !decouple) grad = grad + wd * p;
    const double step = t - 1;
    if (step == 0) {
      v = v + grad * grad;
      return 0.0;
    }
    if (wd != 0 && decouple) p = p - lr * wd * p;
    double normed = grad / std::max(std::sqrt(v), eps);
    if (clip_exponent >= 0) {
      const double clip = std::pow(step, clip_exponent);
      normed = std::min(std::max(normed, -clip), clip);
    }
    m = m + (1 - beta1) * (normed - m);
    p = p - lr * m;
    v = beta2 * v + (1 - beta2) * grad * grad;
    return 0.0;
  };
}

// Adan, the authors' _single_tensor_adan (github.com/sail-sg/Adan); states m (exp_avg),
// m_diff (exp_avg_diff), n (exp_avg_sq), pre_grad. The previous gradient is this one on the
// first step. Hypers unrounded, as adopt_reference's.
inline RefStep adan_reference(const Hypers& h) {
  const double lr = h.at("lr"), beta1 = h.at("beta1"), beta2 = h.at("beta2");
  const double beta3 = h.at("beta3"), eps = h.at("eps"), wd = h.at("weight_decay");
  const bool no_prox = h.at("no_prox") != 0;
  return [=](double t, double& p, double g, double* s) {
    double& m = s[0];
    double& m_diff = s[1];
    double& n = s[2];
    double& pre_grad = s[3];
    if (t == 1) pre_grad = g;
    const double diff = g - pre_grad;
    const double u = g + beta2 * diff;
    m = beta1 * m + (1 - beta1) * g;
    m_diff = beta2 * m_diff + (1 - beta2) * diff;
    n = beta3 * n + (1 - beta3) * u * u;
    const double denom = std::sqrt(n) / std::sqrt(1 - std::pow(beta3, t)) + eps;
    const double update =
        (m / (1 - std::pow(beta1, t)) + beta2 * m_diff / (1 - std::pow(beta2, t))) / denom;
    if (no_prox) {
      p = p * (1 - lr * wd) - lr * update;
    } else {
      p = (p - lr * update) / (1 + lr * wd);
    }
    pre_grad = g;
    return 0.0;
  };
}

// lucidrains/lion-pytorch update_fn (state m).
inline RefStep lion_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), beta1 = hyper(h, "beta1"), beta2 = hyper(h, "beta2");
  const double wd = hyper(h, "weight_decay");
  return [=](double, double& p, double g, double* s) {
    double& m = s[0];
    p = p * (1 - lr * wd);
    const double c = beta1 * m + (1 - beta1) * g;
    // sign() is discontinuous at 0: where c is within fp32 rounding of 0, the kernel may
    // take the other sign, moving p by up to 2 lr (m does not depend on p, so m stays exact).
    const double slack =
        std::abs(c) <= 1e-4 * (beta1 * std::abs(m) + (1 - beta1) * std::abs(g)) ? 2 * lr : 0.0;
    p = p - lr * ((c > 0) - (c < 0));
    m = beta2 * m + (1 - beta2) * g;
    return slack;
  };
}

// bitsandbytes' 8-bit Adam kernel (kOptimizerStatic8bit2StateBlockwise) in float64, its
// states unquantized (states m, v): decay after the update, eps scaled by sqrt(1 - beta2^t).
inline RefStep bnb_adam_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), beta1 = hyper(h, "beta1"), beta2 = hyper(h, "beta2");
  const double eps = hyper(h, "eps"), wd = hyper(h, "weight_decay");
  return [=](double t, double& p, double g, double* s) {
    double &m = s[0], &v = s[1];
    if (!std::isfinite(g)) {
      m = v = 0;
      return 0.0;
    }
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double c2 = std::sqrt(1 - std::pow(beta2, t));
    p = p - lr * c2 / (1 - std::pow(beta1, t)) * m / (std::sqrt(v) + c2 * eps);
    p = p * (1 - lr * wd);
    return 0.0;
  };
}

// torchao's single_param_adam with is_adamw (AdamW4bit), its states unquantized (m, v).
inline RefStep torchao_adamw_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), beta1 = hyper(h, "beta1"), beta2 = hyper(h, "beta2");
  const double eps = hyper(h, "eps"), wd = hyper(h, "weight_decay");
  return [=](double t, double& p, double g, double* s) {
    double &m = s[0], &v = s[1];
    p = p - lr * wd * p;
    m = m + (1 - beta1) * (g - m);
    v = v + (1 - beta2) * (g * g - v);
    const double denom = std::sqrt(v) / std::sqrt(1 - std::pow(beta2, t)) + eps;
    p = p - lr * (m / (1 - std::pow(beta1, t))) / denom;
    return 0.0;
  };
}

// pytorch_pretrained_bert BertAdam.step, without schedule and clipping (states m, v).
inline RefStep bertadam_reference(const Hypers& h) {
  const double lr = hyper(h, "lr"), beta1 = hyper(h, "beta1"), beta2 = hyper(h, "beta2");
  const double eps = hyper(h, "eps"), wd = hyper(h, "weight_decay");
  return [=](double, double& p, double g, double* s) {
    double& m = s[0];
    double& v = s[1];
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    double update = m / (std::sqrt(v) + eps);
    if (wd > 0) update += wd * p;
    p = p - lr * update;
    return 0.0;
  };
}

// ---------------------------------------------------------------------------------------
// Storage formats for the dtype tests, written here rather than taken from the library:
// round to nearest even from float64, and the bit encodings.

/// `x` rounded to nearest even in a binary format with `mant_bits` fraction bits and
/// smallest normal exponent `min_exp` (fp16: 10, -14; bf16: 7, -126). No overflow handling:
/// the values here are far from the largest finite value.
inline double round_to_format(double x, int mant_bits, int min_exp) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(std::abs(x), &e);  // |x| = f * 2^e, f in [0.5, 1): leading bit at 2^(e-1)
  const double ulp = std::ldexp(1.0, std::max(e - 1, min_exp) - mant_bits);
  return std::nearbyint(x / ulp) * ulp;  // scaling by 2^k is exact; nearbyint ties to even
}

inline double format_ulp(double x, int mant_bits, int min_exp) {
  int e = 0;
  std::frexp(std::abs(x), &e);
  return std::ldexp(1.0, std::max(e - 1, min_exp) - mant_bits);
}

inline int mant_bits(DType d) { return d == DType::F16 ? 10 : 7; }
inline int min_exp(DType d) { return d == DType::F16 ? -14 : -126; }

inline double round_to(DType d, double x) { return round_to_format(x, mant_bits(d), min_exp(d)); }

/// The storage bits of `x` (rounded to nearest even first).
inline std::uint16_t encode(DType d, double x) {
  const double r = round_to(d, x);
  if (d == DType::BF16) {
    const float f = static_cast<float>(r);  // exact: a bf16 value is a float value
    std::uint32_t u = 0;
    std::memcpy(&u, &f, 4);
    return static_cast<std::uint16_t>(u >> 16);
  }
  const std::uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::abs(r);
  if (a == 0) return sign;
  if (a < std::ldexp(1.0, -14)) {  // subnormal: a multiple of 2^-24
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::ldexp(a, 24)));
  }
  int e = 0;
  std::frexp(a, &e);
  const int exponent = e - 1;
  const auto mantissa = static_cast<std::uint16_t>(std::ldexp(a, -exponent) * 1024.0 - 1024.0);
  return static_cast<std::uint16_t>(sign | ((exponent + 15) << 10) | mantissa);
}

inline double decode(DType d, std::uint16_t bits) {
  if (d == DType::BF16) {
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f = 0;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

}  // namespace fusedopt::testing
