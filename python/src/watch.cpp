// fusedopt._fusedopt._Watch (watch.hpp). Through the C API: each param and its grad are read
// once per step (the `grad` attribute, `data_ptr()`), compared with what the last step left;
// grads are held weakly, as fusedopt.torch held them, so a dropped grad is freed.
#include "watch.hpp"

#include <cstdint>
#include <vector>

namespace nb = nanobind;

namespace fusedopt::python {

namespace {

/// An interned name, made once (never freed: alive as long as the interpreter).
PyObject* interned(const char* name) { return PyUnicode_InternFromString(name); }

/// `t.data_ptr()`, 0 for None, -1 where the tensor has no storage (a sparse grad: the
/// step's check refuses it), as fusedopt.torch's grad_ptr.
long long data_ptr(PyObject* t) {
  static PyObject* const name = interned("data_ptr");
  if (t == Py_None) return 0;
  PyObject* r = PyObject_CallMethodNoArgs(t, name);
  if (r == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) throw nb::python_error();
    PyErr_Clear();
    return -1;
  }
  const long long v = PyLong_AsLongLong(r);
  Py_DECREF(r);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

/// `p.grad` (a new reference).
nb::object grad_of(PyObject* p) {
  static PyObject* const name = interned("grad");
  PyObject* g = PyObject_GetAttr(p, name);
  if (g == nullptr) throw nb::python_error();
  return nb::steal(g);
}

/// Calls f(param) for every param of `groups` (a list of dicts with a "params" list), in
/// order; stops when f returns false. Returns whether every call returned true.
template <typename F>
bool each_param(nb::handle groups, F&& f) {
  static PyObject* const params = interned("params");
  nb::object seq = nb::steal(PySequence_Fast(groups.ptr(), "param_groups must be a sequence"));
  if (!seq.is_valid()) throw nb::python_error();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* group = PySequence_Fast_GET_ITEM(seq.ptr(), i);
    PyObject* list = PyDict_Check(group) ? PyDict_GetItemWithError(group, params) : nullptr;
    if (list == nullptr) {
      if (PyErr_Occurred()) throw nb::python_error();
      PyErr_SetString(PyExc_KeyError, "a param group without 'params'");
      throw nb::python_error();
    }
    nb::object items = nb::steal(PySequence_Fast(list, "a group's params must be a sequence"));
    if (!items.is_valid()) throw nb::python_error();
    const Py_ssize_t m = PySequence_Fast_GET_SIZE(items.ptr());
    for (Py_ssize_t k = 0; k < m; ++k) {
      if (!f(PySequence_Fast_GET_ITEM(items.ptr(), k))) return false;
    }
  }
  return true;
}

class Watch {
 public:
  /// Every param of `groups`, its grad (weakly) and their addresses as now.
  void remember(nb::handle groups) {
    params_.clear();
    grads_.clear();
    pptrs_.clear();
    gptrs_.clear();
    each_param(groups, [&](PyObject* p) {
      nb::object g = grad_of(p);
      params_.push_back(nb::borrow(p));
      grads_.push_back(g.is_none() ? nb::none() : nb::steal(PyWeakref_NewRef(g.ptr(), nullptr)));
      if (!grads_.back().is_valid()) throw nb::python_error();
      pptrs_.push_back(data_ptr(p));
      gptrs_.push_back(data_ptr(g.ptr()));
      return true;
    });
  }

  /// Whether every param of `groups` and its grad are the objects, at the addresses, that
  /// remember() saw.
  bool unmoved(nb::handle groups) const {
    std::size_t i = 0;
    const bool same = each_param(groups, [&](PyObject* p) {
      if (i >= params_.size() || p != params_[i].ptr()) return false;
      nb::object g = grad_of(p);
      PyObject* last = grads_[i].is_none() ? Py_None : PyWeakref_GetObject(grads_[i].ptr());
      if (g.ptr() != last) return false;  // a dead weak reference is None: a grad now is new
      if (data_ptr(p) != pptrs_[i] || data_ptr(g.ptr()) != gptrs_[i]) return false;
      ++i;
      return true;
    });
    return same && i == params_.size();
  }

 private:
  std::vector<nb::object> params_;
  std::vector<nb::object> grads_;  ///< weak references, or None
  std::vector<long long> pptrs_, gptrs_;
};

}  // namespace

void bind_watch(nb::module_& m) {
  nb::class_<Watch>(m, "_Watch",
                    "Every param, its grad (weakly) and their addresses as the last step left "
                    "them: unmoved(param_groups) proves a steady step in one call.")
      .def(nb::init<>())
      .def("remember", &Watch::remember, nb::arg("param_groups"))
      .def("unmoved", &Watch::unmoved, nb::arg("param_groups"));
}

}  // namespace fusedopt::python
