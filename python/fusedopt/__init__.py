"""fusedopt: optimizers written as rules, compiled into one fused multi-tensor kernel.

The C++ library (rules, code generation, the kernel cache, the fused runtime) as a Python
package. ``fusedopt.torch.Optimizer`` is a ``torch.optim.Optimizer`` over any rule; tensors
cross as DLPack, so the package links no libtorch.
"""

import copyreg

from . import _dtypes
from .errors import (CacheError, CompileError, CudaError, Error, InternalError, IoError,
                     RuleError, UnavailableError, UsageError)
from ._fusedopt import Rule, __version__
from ._fusedopt import compile as _compile
from ._fusedopt import quantized_binding as _quantized_binding

__all__ = [
    "Rule", "Error", "UsageError", "RuleError", "UnavailableError", "IoError", "CompileError",
    "CudaError", "CacheError", "InternalError", "presets", "rule", "warmup", "__version__",
]


def _rule_from(name, text, max_grad_norm):
    """A pickled Rule: a preset by its name, another rule parsed again from its text (named as
    before), a rule with grad clipping (with_grad_clipping) from its own rule and norm."""
    if max_grad_norm is not None:
        return _rule_from(name[:-len("+clip")], text, None).with_grad_clipping(max_grad_norm)
    if name in Rule.presets() and Rule.preset(name).text == text:
        return Rule.preset(name)
    return Rule.parse(text, name + ".rule")


def _reduce_rule(r):
    clipped = r.name.endswith("+clip") and "max_grad_norm" in dict(r.hypers)
    return _rule_from, (r.name, r.text, dict(r.hypers)["max_grad_norm"] if clipped else None)


copyreg.pickle(Rule, _reduce_rule)  # copy.deepcopy, pickle and torch.save take Rules


def presets():
    """The shipped presets, options included ('adam', 'adam+amsgrad', ...)."""
    return list(Rule.presets())


def _check_rule_name(name):
    if not isinstance(name, str) or not name or any(c in name for c in "/\\.") or \
            not name.isprintable() or name != name.strip():
        raise UsageError(f"name={name!r}: a rule's name is a non-empty word without '/', "
                         "'\\', '.' or surrounding spaces (it names the rule in reports, errors "
                         "and the kernel cache)")


def rule(spec, name=None):
    """A Rule from a preset name, a rule's text, or a Rule (returned as is). A rule given as
    text is named ``name`` (in reports, errors as NAME.rule:LINE:COL, the kernel cache's list),
    else ``<rule>``; a preset or a Rule keeps its own name."""
    if name is not None:
        _check_rule_name(name)
    if isinstance(spec, Rule):
        if name is not None and name != spec.name:
            raise UsageError(f"name={name!r}: the Rule given is named {spec.name!r} already "
                             "(name a rule when parsing it: fusedopt.Rule.parse(text, "
                             "'NAME.rule'))")
        return spec
    if not isinstance(spec, str):
        raise UsageError(f"a rule is a preset name, a rule's text or a fusedopt.Rule, "
                         f"not {type(spec).__name__}")
    if "\n" in spec or "=" in spec:
        return Rule.parse(spec, "<rule>" if name is None else name + ".rule")
    if name is not None and name != spec:
        raise UsageError(f"name={name!r}: a preset keeps its own name ({spec!r}); name= is "
                         "for rules given as text")
    return Rule.preset(spec)


def _dtype_name(dtype):
    code = _dtypes.code_of(dtype)
    if code is None:
        raise UsageError(f"dtype {dtype}: fusedopt binds {_dtypes.bound_names()}")
    return code


def warmup(rule_spec="adamw", *, params=None, targets=None, dtypes=None, state_dtype="fp32",
           master_weights=False, max_grad_norm=0.0, quant_min_numel=4096):
    """Compiles kernels into the kernel cache ahead of training, so that the first step does
    not wait for a compile; ``fusedopt-cache warmup`` fills the same cache.

    Either ``params`` (the tensors an Optimizer will get: their devices and dtypes give the
    targets and dtype bindings) or ``targets`` ('host', 'sm_90', ...) and ``dtypes`` (a
    param dtype per binding: 'fp32', 'bf16', or a full binding 'bf16:bf16:fp32+master').
    A rule with ``storage`` declarations (adamw8bit, ...) also gets the quantized binding its
    params of ``quant_min_numel`` elements or more step in (with ``targets``: always).
    Returns one dict per kernel: key, origin ('compiled', 'disk', 'memory'), seconds.
    """
    r = rule(rule_spec)
    if max_grad_norm:
        r = r.with_grad_clipping(max_grad_norm)
    state = _dtype_name(state_dtype)
    jobs = set()

    def add(target, binding, quantized):
        jobs.add((target, binding))
        q = _quantized_binding(r, binding) if quantized else None
        if q is not None:
            jobs.add((target, q))

    if params is not None:
        for p in params:
            for q in p["params"] if isinstance(p, dict) else [p]:
                add(*_job_of(q, state, master_weights), q.numel() >= quant_min_numel)
    else:
        for target in targets or ["host"]:
            for d in dtypes or ["fp32"]:
                binding = d if ":" in d else _binding(_dtype_name(d), state, master_weights)
                add(target, binding, True)
    return [_compile(r, target, binding) for target, binding in sorted(jobs)]


def _binding(param, state, master):
    master = master and param != "fp32"
    return f"{param}:{param}:{state}" + ("+master" if master else "")


def _job_of(p, state, master):
    dtype = _dtype_name(p.dtype)
    if p.device.type == "cuda":
        import torch
        major, minor = torch.cuda.get_device_capability(p.device)
        target = f"sm_{major}{minor}"
    else:
        target = "host"
    return target, _binding(dtype, state, master)
