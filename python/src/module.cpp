// fusedopt._fusedopt: the C++ library as a Python extension (nanobind). No libtorch: tensors
// cross as DLPack (their __dlpack__), both ways, without a copy. The Python package
// (python/fusedopt) builds the torch.optim.Optimizer on top of this.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"
#include "fusedopt/kernel.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/state_check.hpp"
#include "fusedopt/version.hpp"
#include "watch.hpp"

namespace nb = nanobind;
namespace fo = fusedopt;

namespace {

using Array = nb::ndarray<nb::ro>;  // any DLPack tensor, never converted (no copy)

/// The Python exception classes of fusedopt.errors (set at import).
struct Errors {
  nb::object error, usage, unavailable, io, rule, compile, cuda, cache, internal;
};
Errors& errors() {
  static Errors* e = new Errors;  // never destroyed: alive as long as the interpreter
  return *e;
}

void translate(const std::exception_ptr& p, void*) {
  const Errors& e = errors();
  auto set = [](const nb::object& cls, nb::object instance) {
    PyErr_SetObject(cls.ptr(), instance.ptr());
  };
  try {
    std::rethrow_exception(p);
  } catch (const fo::RuleError& x) {
    set(e.rule,
        e.rule(x.what(), x.file(), x.line(), x.column(), x.message(), x.source_line(), x.hint()));
  } catch (const fo::CompileError& x) {
    set(e.compile, e.compile(x.what(), x.log(), x.source()));
  } catch (const fo::UsageError& x) {
    set(e.usage, e.usage(x.what()));
  } catch (const fo::UnavailableError& x) {
    set(e.unavailable, e.unavailable(x.what()));
  } catch (const fo::IoError& x) {
    set(e.io, e.io(x.what()));
  } catch (const fo::CudaError& x) {
    set(e.cuda, e.cuda(x.what()));
  } catch (const fo::CacheError& x) {
    set(e.cache, e.cache(x.what()));
  } catch (const fo::InternalError& x) {
    set(e.internal, e.internal(x.what()));
  } catch (const fo::Error& x) {
    set(e.error, e.error(x.what()));
  }
}

/// The storage dtype of a DLPack tensor, or a UsageError naming it.
fo::DType dtype_of(const Array& a, const std::string& who) {
  const nb::dlpack::dtype d = a.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
  if (d.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && d.bits == 32) return fo::DType::F32;
    if (code == nb::dlpack::dtype_code::Float && d.bits == 16) return fo::DType::F16;
    if (code == nb::dlpack::dtype_code::Bfloat && d.bits == 16) return fo::DType::BF16;
    if (code == nb::dlpack::dtype_code::Float && d.bits == 64) return fo::DType::F64;
  }
  const char* kind = code == nb::dlpack::dtype_code::Float    ? "float"
                     : code == nb::dlpack::dtype_code::Bfloat ? "bfloat"
                     : code == nb::dlpack::dtype_code::Int    ? "int"
                     : code == nb::dlpack::dtype_code::UInt   ? "uint"
                                                              : "other";
  throw fo::UsageError(who + " has dtype " + kind + std::to_string(d.bits) +
                       "; fusedopt binds float32, float16, bfloat16 and float64");
}

/// A fusedopt Tensor viewing a DLPack tensor in place (C-contiguous, one of our dtypes, on
/// the host or a CUDA device), or a UsageError naming it.
fo::Tensor view(const Array& a, const std::string& name) {
  fo::Tensor t;
  t.name = name;
  t.dtype = dtype_of(a, name);
  std::int64_t numel = 1, expect = 1;
  for (std::size_t d = 0; d < a.ndim(); ++d) numel *= static_cast<std::int64_t>(a.shape(d));
  // An empty tensor has no memory to walk (torch 1.13 exports (0, 5) with strides (1, 1)).
  for (std::size_t d = a.ndim(); numel > 0 && d-- > 0;) {
    const auto size = static_cast<std::int64_t>(a.shape(d));
    if (size != 1 && a.stride(d) != expect) {
      throw fo::UsageError(name +
                           " is not contiguous (call .contiguous() on it, or keep the "
                           "parameter contiguous: the fused kernel walks memory in order)");
    }
    expect *= size;
  }
  for (std::size_t d = 0; d < a.ndim(); ++d)
    t.shape.push_back(static_cast<std::int64_t>(a.shape(d)));
  t.numel = numel;
  t.data = const_cast<void*>(a.data());
  const int type = a.device_type();
  if (type == nb::device::cpu::value) {
    t.device = fo::Device::host();
  } else if (type == nb::device::cuda::value) {
    t.device = fo::Device::cuda(a.device_id());
  } else {
    throw fo::UsageError(name + " lives on a DLPack device of type " + std::to_string(type) +
                         "; fusedopt runs on the CPU and on CUDA devices");
  }
  return t;
}

/// One param group as Python gives it: params, grads (same order), names, hypers, and
/// `wholes`: empty, or per param (whole shape, dim-0 offset) when it is a piece of a bigger
/// tensor (Tensor::whole_shape; an empty shape: that param is whole).
struct GroupSpec {
  std::vector<Array> params, grads;
  std::vector<std::string> names;
  std::vector<std::pair<std::string, double>> hypers;
  std::vector<std::pair<std::vector<std::int64_t>, std::int64_t>> wholes;
};

/// "auto", "recompute" or "store", or a UsageError (the library's one parser).
fo::ReductionStrategy strategy_of(const std::string& name) {
  return fo::parse_reduction_strategy(name);
}

void* as_stream(std::uintptr_t stream) { return reinterpret_cast<void*>(stream); }

using StoragePairs = std::vector<std::pair<std::string, std::string>>;

/// A fusedopt::Optimizer over tensors Python owns (their memory must outlive it: the
/// Python side keeps them), with the shapes its state views take.
class Engine {
 public:
  Engine(const fo::Rule& rule, std::vector<GroupSpec> groups, const fo::OptimizerOptions& options) {
    std::vector<fo::ParamGroup> pgs;
    for (GroupSpec& g : groups) {
      if (g.params.size() != g.grads.size() || g.params.size() != g.names.size()) {
        throw fo::UsageError("a param group needs as many grads and names as params");
      }
      if (!g.wholes.empty() && g.wholes.size() != g.params.size()) {
        throw fo::UsageError("a param group's wholes need one (shape, offset) per param, or none");
      }
      fo::ParamGroup pg;
      for (std::size_t i = 0; i < g.params.size(); ++i) {
        pg.params.push_back(view(g.params[i], g.names[i]));
        if (!g.wholes.empty()) {
          pg.params.back().whole_shape = g.wholes[i].first;
          pg.params.back().whole_offset = g.wholes[i].second;
        }
        fo::Tensor grad = view(g.grads[i], g.names[i] + ".grad");
        grad.shape.clear();
        pg.grads.push_back(std::move(grad));
        shapes_.push_back(pg.params.back().shape);
      }
      pg.hypers = std::move(g.hypers);
      pgs.push_back(std::move(pg));
    }
    opt_.emplace(rule, std::move(pgs), options);
    // One device (the Optimizer checked): the first param's.
    for (const auto& g : groups) {
      if (!g.params.empty()) {
        const Array& p = g.params.front();
        device_ = p.device_type() == nb::device::cuda::value ? p.device_id() : -1;
        break;
      }
    }
  }

  void step(std::uintptr_t stream) { opt_->step(as_stream(stream)); }

  /// torch's AMP protocol; None: the verdict is on the device still (ask step_taken()).
  std::optional<bool> step_amp(std::optional<Array> grad_scale, std::optional<Array> found_inf,
                               std::uintptr_t stream) {
    auto scalar = [](const std::optional<Array>& a, const char* what) -> const float* {
      if (!a) return nullptr;
      if (dtype_of(*a, what) != fo::DType::F32 || a->size() != 1) {
        throw fo::UsageError(std::string(what) + " must be one float32 value");
      }
      return static_cast<const float*>(a->data());
    };
    last_ = opt_->step_amp(scalar(grad_scale, "grad_scale"), scalar(found_inf, "found_inf"),
                           as_stream(stream));
    if (last_.known()) return last_.taken();
    return std::nullopt;
  }

  bool step_taken() const { return last_.taken(); }

  /// New addresses of params and grads (0: unchanged), checked by the caller to hold what
  /// construction was given; see Optimizer::rebind.
  void rebind(const std::vector<std::uintptr_t>& params, const std::vector<std::uintptr_t>& grads,
              std::uintptr_t stream) {
    auto ptrs = [](const std::vector<std::uintptr_t>& list) {
      std::vector<void*> out;
      out.reserve(list.size());
      for (std::uintptr_t a : list) out.push_back(reinterpret_cast<void*>(a));
      return out;
    };
    opt_->rebind(ptrs(params), ptrs(grads), as_stream(stream));
  }

  void set_hyper(const std::string& name, double value, std::optional<int> group,
                 std::optional<std::uintptr_t> stream) {
    if (stream) {
      opt_->set_hyper(name, value, group, as_stream(*stream));
    } else {
      opt_->set_hyper(name, value, group);
    }
  }
  double hyper(const std::string& name, int group) const { return opt_->hyper(name, group); }
  std::int64_t step_count() const { return opt_->step_count(); }
  /// Every state kept per param as (name, kind): "element", "output", "scalar", "row",
  /// "col", "master" (Optimizer::states()).
  std::vector<std::pair<std::string, std::string>> states() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const fo::StateInfo& s : opt_->states()) out.emplace_back(s.name, fo::to_string(s.kind));
    return out;
  }
  void set_step_count(std::int64_t n) { opt_->set_step_count(n); }

  /// The step count where the steps write it, as a 0-d float64 DLPack tensor (host or
  /// device memory, zero-copy; it keeps `self` alive): fusedopt.torch's live state['step'].
  static nb::object step_view(nb::handle self) {
    Engine& e = nb::cast<Engine&>(self);
    const fo::Tensor t = fo::OptimizerExtension::step_counter(*e.opt_);
    const bool cuda = t.device.kind == fo::Device::Kind::Cuda;
    nb::ndarray<nb::pytorch, double> out(t.data, 0, nullptr, self, nullptr, nb::dtype<double>(),
                                         cuda ? nb::device::cuda::value : nb::device::cpu::value,
                                         cuda ? t.device.index : 0);
    return nb::cast(out, nb::rv_policy::reference);
  }

  /// `fn(pass, stage, totals, slots, tensor_totals, shard, shard_max, stream)` with each
  /// reduction pass's raw partials on this process (see ReductionPartials) before anything
  /// reads them, each a float64 tensor viewing the optimizer's memory (host or device;
  /// valid during the call, to be combined in place across the ranks that hold pieces of
  /// the same tensors): `totals` the global ones, `slots` [(name, per_tensor, index,
  /// by_max)] this call's, `tensor_totals` one 2-D tensor per dtype binding ([tensor,
  /// slot]: combine the columns of this call's per-tensor slots), `shard` the sums that span
  /// pieces (combine all of it; empty without pieces), `shard_max` the indices of `shard`
  /// combined by max (empty: all by sum). `stage` 0 is a pass's totals; 1 (pieces of a
  /// factored rule) a second call of the pass with only the shard (no slots, no tensor
  /// totals). Every rank gets the same calls with the same sizes. None: no hook.
  void set_reduction_hook(nb::object fn) {
    if (fn.is_none()) {
      fo::OptimizerExtension::set_reduction_hook(*opt_, {});
      return;
    }
    fo::OptimizerExtension::set_reduction_hook(*opt_, [fn = std::move(fn)](
                                                          const fo::ReductionPartials& t) {
      nb::gil_scoped_acquire gil;
      const bool cuda = t.device.kind == fo::Device::Kind::Cuda;
      static double dummy = 0;  // no totals: an empty view needs some address
      auto view_of = [&](double* data, std::size_t ndim, const std::size_t* shape) {
        std::size_t n = 1;
        for (std::size_t d = 0; d < ndim; ++d) n *= shape[d];
        nb::ndarray<nb::pytorch, double> a(
            data && n > 0 ? data : &dummy, ndim, shape, nb::handle(), nullptr, nb::dtype<double>(),
            cuda ? nb::device::cuda::value : nb::device::cpu::value, cuda ? t.device.index : 0);
        return nb::cast(a, nb::rv_policy::reference);
      };
      const std::size_t n = static_cast<std::size_t>(t.num_global);
      nb::list slots;
      for (const fo::ReductionSlotInfo& s : t.slots)
        slots.append(nb::make_tuple(s.name, s.per_tensor, s.slot, s.max));
      nb::list tensor_totals;
      for (const fo::ReductionPartials::TensorTotals& b : t.tensors) {
        const std::size_t shape[2] = {static_cast<std::size_t>(b.num_tensors),
                                      static_cast<std::size_t>(b.stride)};
        tensor_totals.append(view_of(b.data, 2, shape));
      }
      const std::size_t shard_n = static_cast<std::size_t>(t.num_shard);
      nb::list shard_max;
      for (std::size_t i = 0; i < t.shard_max.size(); ++i) {
        if (t.shard_max[i]) shard_max.append(i);
      }
      fn(t.pass, t.stage, view_of(t.global, 1, &n), slots, tensor_totals,
         view_of(t.shard, 1, &shard_n), shard_max, reinterpret_cast<std::uintptr_t>(t.stream));
    });
  }

  /// State `name` of param `index` as a DLPack tensor (zero-copy; it keeps `self` alive).
  /// Element states take the param's shape, scalars are 0-d, row/col states flat.
  static nb::object state(nb::handle self, const std::string& name, int index,
                          const std::string& shape_as) {
    Engine& e = nb::cast<Engine&>(self);
    const fo::Tensor t = e.opt_->state(name, index);
    std::vector<std::size_t> shape;
    if (shape_as == "param") {
      for (std::int64_t d : e.shapes_.at(static_cast<std::size_t>(index)))
        shape.push_back(static_cast<std::size_t>(d));
    } else if (shape_as == "flat") {
      shape.push_back(static_cast<std::size_t>(t.numel));
    }  // "scalar": 0-d
    nb::dlpack::dtype dt = nb::dtype<float>();
    if (t.dtype == fo::DType::F64) dt = nb::dtype<double>();
    if (t.dtype == fo::DType::U8) dt = nb::dtype<std::uint8_t>();
    if (t.dtype == fo::DType::F16)
      dt = {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    if (t.dtype == fo::DType::BF16)
      dt = {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    static float dummy = 0;  // an empty tensor's view needs some address
    void* data = t.data ? t.data : &dummy;
    const bool cuda = t.device.kind == fo::Device::Kind::Cuda && t.data != nullptr;
    nb::ndarray<nb::pytorch> out(data, shape.size(), shape.data(), self, nullptr, dt,
                                 cuda ? nb::device::cuda::value : nb::device::cpu::value,
                                 cuda ? t.device.index : 0);
    return nb::cast(out, nb::rv_policy::reference);
  }

  nb::dict stats() const {
    const fo::OptimizerStats s = opt_->stats();
    nb::dict d;
    d["tensors"] = s.tensors;
    d["elements"] = s.elements;
    d["launches_per_step"] = s.launches_per_step;
    d["bytes_per_step"] = s.bytes_per_step;
    // Per binding and pass: what it reads, updates in place and only writes (bits per
    // element, role by role): what an in-place floor must move (bench/torch_step.py).
    nb::list traffic;
    for (const fo::PassTraffic& t : s.traffic) {
      nb::dict p;
      p["elements"] = t.elements;
      p["read_bits"] = t.read_bits;
      p["update_bits"] = t.update_bits;
      p["write_bits"] = t.write_bits;
      traffic.append(p);
    }
    d["traffic"] = traffic;
    d["state_bytes"] = s.state_bytes;
    d["reduction_passes"] = s.reduction_passes;
    d["reduction_strategy"] = s.reduction_strategy ? fo::to_string(*s.reduction_strategy) : "";
    d["schedule_report"] = s.schedule_report;
    d["kernel_keys"] = s.kernel_keys;
    d["kernel_seconds"] = s.kernel_seconds;
    d["kernel_origin"] = s.kernel_origin ? fo::to_string(*s.kernel_origin) : "";
    d["fusion_report"] = s.fusion_report;
    return d;
  }

  void save(const std::string& path) const { opt_->save(path); }
  void load(const std::string& path) { opt_->load(path); }
  int device() const { return device_; }

 private:
  std::optional<fo::Optimizer> opt_;
  std::vector<std::vector<std::int64_t>> shapes_;
  fo::StepResult last_;
  int device_ = -1;
};

}  // namespace

namespace {

/// The Python exception of each C++ error class (fusedopt.errors).
void bind_errors(nb::module_& m) {
  nb::module_ err = nb::module_::import_("fusedopt.errors");
  Errors& e = errors();
  e.error = err.attr("Error");
  e.usage = err.attr("UsageError");
  e.unavailable = err.attr("UnavailableError");
  e.io = err.attr("IoError");
  e.rule = err.attr("RuleError");
  e.compile = err.attr("CompileError");
  e.cuda = err.attr("CudaError");
  e.cache = err.attr("CacheError");
  e.internal = err.attr("InternalError");
  nb::register_exception_translator(translate);
}

/// fusedopt.Rule.
void bind_rule(nb::module_& m) {
  nb::class_<fo::Rule>(m, "Rule", "A parsed and checked optimizer rule (immutable).")
      .def_static(
          "parse",
          [](const std::string& text, const std::string& file) {
            return fo::Rule::parse(text, file);
          },
          nb::arg("text"), nb::arg("file") = "<rule>",
          "Parses and checks a rule's text; raises RuleError (file, line, column).")
      .def_static("preset", &fo::Rule::preset, nb::arg("name"),
                  "A shipped preset ('adamw', 'sgd', 'adamw+amsgrad', ...).")
      .def_static("presets", &fo::Rule::presets)
      .def_static("preset_options", &fo::Rule::preset_options, nb::arg("name"))
      .def_prop_ro("name", &fo::Rule::name)
      .def_prop_ro("hypers", &fo::Rule::hypers)
      .def_prop_ro("states", &fo::Rule::states)
      .def_prop_ro("scalars", &fo::Rule::scalars)
      .def_prop_ro("row_states", &fo::Rule::row_states)
      .def_prop_ro("col_states", &fo::Rule::col_states)
      .def_prop_ro("storage", &fo::Rule::storage)
      .def_prop_ro("reduction_passes", &fo::Rule::reduction_passes)
      .def_prop_ro("text", &fo::Rule::text)
      .def("describe", &fo::Rule::describe)
      .def("with_grad_clipping", &fo::Rule::with_grad_clipping, nb::arg("max_grad_norm") = 1.0)
      .def("__repr__", [](const fo::Rule& r) { return "<fusedopt.Rule '" + r.name() + "'>"; });
}

/// fusedopt::OptimizerOptions as _Options: the one struct fusedopt.torch's options cross in
/// (dtypes and the reduction strategy by their names; the library parses them).
void bind_options(nb::module_& m) {
  using O = fo::OptimizerOptions;
  nb::class_<O>(m, "_Options")
      .def(nb::init<>())
      .def_prop_rw(
          "state_dtype", [](const O& o) { return std::string(fo::to_string(o.state_dtype)); },
          [](O& o, const std::string& name) {
            o.state_dtype = fo::DTypeBinding::parse(name).param;
          })
      .def_rw("master_weights", &O::master_weights)
      .def_rw("max_grad_norm", &O::max_grad_norm)
      .def_prop_rw(
          "reduction_strategy",
          [](const O& o) { return std::string(fo::to_string(o.reduction_strategy)); },
          [](O& o, const std::string& name) { o.reduction_strategy = strategy_of(name); })
      .def_rw("state_storage", &O::state_storage)
      .def_rw("quant_block", &O::quant_block)
      .def_rw("quant_min_numel", &O::quant_min_numel)
      .def_rw("stochastic_rounding", &O::stochastic_rounding)
      .def_rw("seed", &O::seed)
      .def_prop_rw(
          "matrix_precision",
          [](const O& o) { return std::string(fo::to_string(o.matrix_precision)); },
          [](O& o, const std::string& name) {
            o.matrix_precision = fo::DTypeBinding::parse(name).param;
          });
}

/// The optimizer engine behind fusedopt.torch.Optimizer (_Engine, _GroupSpec).
void bind_engine(nb::module_& m) {
  nb::class_<GroupSpec>(m, "_GroupSpec")
      .def(nb::init<>())
      .def_rw("params", &GroupSpec::params)
      .def_rw("grads", &GroupSpec::grads)
      .def_rw("names", &GroupSpec::names)
      .def_rw("hypers", &GroupSpec::hypers)
      .def_rw("wholes", &GroupSpec::wholes);

  nb::class_<Engine>(m, "_Engine")
      .def(nb::init<const fo::Rule&, std::vector<GroupSpec>, const fo::OptimizerOptions&>(),
           nb::arg("rule"), nb::arg("groups"), nb::arg("options"))
      .def("step", &Engine::step, nb::arg("stream") = 0)
      .def("step_amp", &Engine::step_amp, nb::arg("grad_scale").none(), nb::arg("found_inf").none(),
           nb::arg("stream") = 0)
      .def("step_taken", &Engine::step_taken)
      .def("rebind", &Engine::rebind, nb::arg("params"), nb::arg("grads"), nb::arg("stream") = 0)
      .def("set_hyper", &Engine::set_hyper, nb::arg("name"), nb::arg("value"),
           nb::arg("group").none() = nb::none(), nb::arg("stream").none() = nb::none())
      .def("hyper", &Engine::hyper, nb::arg("name"), nb::arg("group") = 0)
      .def("step_count", &Engine::step_count)
      .def("set_step_count", &Engine::set_step_count)
      .def("step_view", &Engine::step_view)
      .def("set_reduction_hook", &Engine::set_reduction_hook, nb::arg("fn").none())
      .def("states", &Engine::states)
      .def("state", &Engine::state, nb::arg("name"), nb::arg("index"),
           nb::arg("shape_as") = "param")
      .def("stats", &Engine::stats)
      .def("save", &Engine::save)
      .def("load", &Engine::load)
      .def_prop_ro("device", &Engine::device);
}

/// check_loaded_state: the one check of a quantized state before it is loaded, for
/// fusedopt.torch's load_state_dict and edits of opt.state.
void bind_state_check(nb::module_& m) {
  m.def(
      "check_loaded_state",
      [](const std::string& who, const std::string& storage, int block, std::int64_t numel,
         const std::string& saved_storage, std::int64_t saved_block, const std::string& codes_dtype,
         std::int64_t codes_numel, const Array& codes, const std::string& absmax_dtype,
         std::int64_t absmax_numel, const Array& absmax) {
        fo::KeptState kept;
        kept.block = block;
        kept.numel = numel;
        for (fo::Quant q : {fo::Quant::Q8S, fo::Quant::Q8U, fo::Quant::Q4S, fo::Quant::Q4U}) {
          if (storage == fo::to_string(q)) kept.storage = q;
        }
        // The check reads the data only where the dtype is the expected one: then it must be
        // contiguous host memory of that many elements.
        auto data = [&](const Array& a, const std::string& dtype, std::int64_t n, const char* want,
                        std::size_t size) -> const void* {
          if (dtype != want) return nullptr;
          if (a.device_type() != nb::device::cpu::value ||
              a.nbytes() != static_cast<std::size_t>(n) * size) {
            throw fo::UsageError(who + ": check_loaded_state takes contiguous host tensors");
          }
          return a.data();
        };
        fo::LoadedState in{saved_storage,
                           saved_block,
                           codes_dtype,
                           codes_numel,
                           data(codes, codes_dtype, codes_numel, "U8", 1),
                           absmax_dtype,
                           absmax_numel,
                           data(absmax, absmax_dtype, absmax_numel, "F32", 4)};
        fo::check_loaded_state(who, kept, in);
      },
      nb::arg("who"), nb::arg("storage"), nb::arg("block"), nb::arg("numel"),
      nb::arg("saved_storage"), nb::arg("saved_block"), nb::arg("codes_dtype"),
      nb::arg("codes_numel"), nb::arg("codes"), nb::arg("absmax_dtype"), nb::arg("absmax_numel"),
      nb::arg("absmax"),
      "The one check of a quantized state before it is loaded (fusedopt/state_check.hpp): kept "
      "as `storage` ('q8s', ...) in blocks of `block` for `numel` elements, saved as "
      "`saved_storage` in blocks of `saved_block` ('' and 0: not recorded); its codes and "
      "absmax as their dtypes' safetensors names ('U8', 'F32', 'I64', ...), element counts "
      "and, where the dtype is right, contiguous host tensors. UsageError otherwise.");
}

/// Module functions: check_hyper_value, compile.
void bind_functions(nb::module_& m) {
  m.def(
      "resolve_state_storage",
      [](const fo::Rule& rule, StoragePairs storage) {
        fo::OptimizerOptions o;
        o.state_storage = std::move(storage);
        std::vector<std::string> out;
        for (fo::Quant q : fo::resolve_state_storage(rule, o)) out.emplace_back(fo::to_string(q));
        return out;
      },
      nb::arg("rule"), nb::arg("state_storage"),
      "The storage of each of the rule's states ('-', 'q8s', 'q8u', 'q4s', 'q4u') under the "
      "rule's declarations and `state_storage` (pairs of state name or '*' and kind).");
  m.def(
      "quantized_binding",
      [](const fo::Rule& rule, const std::string& plain) -> std::optional<std::string> {
        const std::optional<fo::DTypeBinding> q =
            fo::quantized_binding(rule, fo::DTypeBinding::parse(plain));
        if (!q) return std::nullopt;
        return q->str();
      },
      nb::arg("rule"), nb::arg("binding"),
      "The binding (text) params of at least quant_min_numel elements step in where `binding` "
      "is the smaller ones' (fusedopt::quantized_binding under default options), or None.");
  m.def(
      "check_options",
      [](const fo::Rule& rule, const fo::OptimizerOptions& o) {
        fo::check_options(o);
        std::vector<std::string> out;
        for (fo::Quant q : fo::resolve_state_storage(rule, o)) out.emplace_back(fo::to_string(q));
        return out;
      },
      nb::arg("rule"), nb::arg("options"),
      "The Optimizer's checks of its options alone (UsageError naming the first bad one), then "
      "resolve_state_storage's storage of each of the rule's states under them.");
  m.def("check_hyper_value", &fo::check_hyper_value, nb::arg("where"), nb::arg("name"),
        nb::arg("group"), nb::arg("value"),
        "The one rule for a hyper's value (finite, within fp32's range): UsageError otherwise.");

  m.def(
      "compile",
      [](const fo::Rule& rule, const std::string& target, const std::string& dtypes,
         const std::string& strategy) {
        fo::CompileOptions o;
        o.reduction_strategy = strategy_of(strategy);
        const fo::CompiledKernel k =
            fo::compile_kernel(rule, fo::Target::parse(target), fo::DTypeBinding::parse(dtypes), o);
        nb::dict d;
        d["key"] = k.key;
        d["origin"] = k.origin;
        d["seconds"] = k.seconds;
        d["target"] = k.target.str();
        d["dtypes"] = k.dtypes.str();
        d["disk_entry"] = k.disk_entry.string();
        return d;
      },
      nb::arg("rule"), nb::arg("target") = "host", nb::arg("dtypes") = "fp32",
      nb::arg("strategy") = "auto",
      "Compiles (or fetches from the kernel cache) `rule` for a target ('host', 'sm_90') and "
      "a dtype binding ('fp32', 'bf16:bf16:fp32+master').");
}

}  // namespace

NB_MODULE(_fusedopt, m) {
  m.doc() = "fusedopt's C++ library (rules, kernels, the fused optimizer runtime)";
  m.attr("__version__") = FUSEDOPT_VERSION_STRING;
  bind_errors(m);
  bind_rule(m);
  bind_options(m);
  bind_engine(m);
  bind_functions(m);
  fusedopt::python::bind_watch(m);
  bind_state_check(m);
}
