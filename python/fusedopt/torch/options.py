"""The options of a whole ``fusedopt.torch.Optimizer`` (not hypers of a group): their list and
defaults, written once here; their checks; and the one C++ struct (``fusedopt::
OptimizerOptions``, bound as ``_Options``) they cross into the library as."""

import inspect
import operator

import torch

from .. import _dtypes
from .. import _fusedopt as _C
from ..errors import UsageError

__all__ = ["OPTIONS", "Options", "signature"]

# Every option and its default. `rule` and `params` come first in the constructor; the rest
# are keyword-only. A wrapper that copies its keyword arguments into every param group
# (torch's ZeroRedundancyOptimizer) may leave them there: a group may carry one only with the
# optimizer's own value.
OPTIONS = {
    "state_dtype": torch.float32,
    "master_weights": False,
    "max_grad_norm": 0.0,
    "reduction_strategy": "auto",
    "process_group": None,
    "state_storage": None,
    "quant_block": 0,
    "quant_min_numel": 4096,
    "stochastic_rounding": False,
    "seed": 0,
    "matrix_precision": "fp32",
}


def signature():
    """The constructor's signature (for help() and inspect), from OPTIONS."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("params", P.POSITIONAL_OR_KEYWORD),
              P("rule", P.POSITIONAL_OR_KEYWORD, default="adamw")]
    params += [P(name, P.KEYWORD_ONLY, default=value) for name, value in OPTIONS.items()]
    params.append(P("hypers", P.VAR_KEYWORD))
    return inspect.Signature(params)


def int_option(name, value, high, low=None):
    """An integer option within [low (default -high - 1), high], else UsageError."""
    low = -high - 1 if low is None else low
    try:
        n = operator.index(value)
    except TypeError:
        raise UsageError(f"{name} is {value!r} (a {type(value).__name__}); give an integer") \
            from None
    if not low <= n <= high:
        raise UsageError(f"{name} is {n}: it must be from {low} to {high}")
    return n


def _storage_pairs(storage):
    """OptimizerOptions::state_storage from the keyword: None, a kind for every state, or a
    dict of state name to kind."""
    if storage is None:
        return []
    if isinstance(storage, str):
        return [("*", storage)]
    if isinstance(storage, dict):
        return [(str(k), str(v)) for k, v in storage.items()]
    raise UsageError(f"state_storage is {storage!r}: give a kind for every state ('q8', 'q4', "
                     "...) or a dict of state name to kind")


_MATRIX_PRECISIONS = {"fp32": "fp32", "bf16": "bf16", torch.float32: "fp32",
                      torch.bfloat16: "bf16"}


def _matrix_precision(value):
    """OptimizerOptions::matrix_precision from the keyword: 'fp32' or 'bf16' (or the torch
    dtype)."""
    try:
        return _MATRIX_PRECISIONS[value]
    except (KeyError, TypeError):
        raise UsageError(f"matrix_precision is {value!r}: give 'fp32' (the Newton-Schulz "
                         "iteration of a matrix stage in fp32) or 'bf16' (rounded as "
                         "torch.optim.Muon iterates)") from None


def _dtype_code(dtype, who):
    if isinstance(dtype, str):
        return dtype  # a code ('bf16'): the library parses it (UsageError naming a bad one)
    code = _dtypes.code_of(dtype) if isinstance(dtype, torch.dtype) else None
    if code is None:
        raise UsageError(f"{who} has dtype {dtype}; fusedopt binds {_dtypes.bound_names()}")
    return code


class Options:
    """The options one optimizer was built with: as given (``given``, compared with what a
    group carries), the C++ struct (``cpp``), and what the front end reads of them."""

    def __init__(self, rule, given, hypers):
        """`given`: every name of OPTIONS (the user's values). A rule that clips by itself
        (lamb: a hyper max_grad_norm) takes max_grad_norm as its hyper, into `hypers`."""
        self.given = dict(given)
        rule_hypers = dict(rule.hypers)
        max_grad_norm = given["max_grad_norm"]
        if "max_grad_norm" in rule_hypers:
            if float(max_grad_norm) != 0.0:
                hypers.setdefault("max_grad_norm", max_grad_norm)
            max_grad_norm = 0.0
            del self.given["max_grad_norm"]
        # The options a group may carry (with the optimizer's value): not the rule's hypers.
        self.names = tuple(k for k in ("rule",) + tuple(OPTIONS) if k not in rule_hypers)
        o = _C._Options()
        o.state_dtype = _dtype_code(given["state_dtype"], "state_dtype")
        o.master_weights = bool(given["master_weights"])
        o.max_grad_norm = float(max_grad_norm)
        o.reduction_strategy = str(given["reduction_strategy"])
        o.state_storage = _storage_pairs(given["state_storage"])
        o.quant_block = int_option("quant_block", given["quant_block"], 2**31 - 1)
        o.quant_min_numel = int_option("quant_min_numel", given["quant_min_numel"], 2**63 - 1)
        o.stochastic_rounding = bool(given["stochastic_rounding"])
        # A negative seed stands for its 64-bit two's complement.
        o.seed = int_option("seed", given["seed"], 2**64 - 1, low=-2**63) % 2**64
        o.matrix_precision = _matrix_precision(given["matrix_precision"])
        self.cpp = o
        # Checked as the first step would check them (UsageError naming the first bad one),
        # and each state's storage ('-' or a kind) where a param is quantized.
        self.storage = dict(zip(rule.states, _C.check_options(rule, o)))
        self.state_dtype = o.state_dtype  # the code: 'fp32', 'bf16', ...

    _FIELDS = ("state_dtype", "master_weights", "max_grad_norm", "reduction_strategy",
               "state_storage", "quant_block", "quant_min_numel", "stochastic_rounding", "seed",
               "matrix_precision")

    def __getstate__(self):  # the C++ struct as its fields (copies and pickles)
        d = dict(self.__dict__)
        d["cpp"] = {name: getattr(self.cpp, name) for name in self._FIELDS}
        return d

    def __setstate__(self, d):
        o = _C._Options()
        for name, value in d["cpp"].items():
            setattr(o, name, value)
        self.__dict__.update(d, cpp=o)

    @property
    def max_grad_norm(self):
        return self.cpp.max_grad_norm

    @property
    def master_weights(self):
        return self.cpp.master_weights

    @property
    def quant_min_numel(self):
        return self.cpp.quant_min_numel

    def quant_block(self):
        """Elements per absmax block (DTypeBinding::block): the option, else 256, or 128 with
        a 4-bit state."""
        if self.cpp.quant_block:
            return self.cpp.quant_block
        return 128 if any(k.startswith("q4") for k in self.storage.values()) else 256

    def check_group(self, where, g, group):
        """A group may carry an option (copied in by a wrapper) only with the optimizer's own
        value."""
        for key in self.names:
            if key not in group:
                continue
            value, mine = group[key], self.given[key]
            if key == "state_dtype":
                same = value == mine or (not isinstance(value, str) and
                                         _dtypes.code_of(value) == self.state_dtype)
            elif key == "matrix_precision":
                same = _MATRIX_PRECISIONS.get(value) == self.cpp.matrix_precision \
                    if isinstance(value, (str, torch.dtype)) else False
            elif key in ("rule", "process_group"):
                same = value is mine or (isinstance(value, str) and isinstance(mine, str)
                                         and value == mine)
            else:
                try:
                    same = type(mine)(value) == mine
                except (TypeError, ValueError):
                    same = False
            if not same:
                raise UsageError(f"{where}: param group {g} has {key}={value!r}, but the "
                                 f"optimizer was built with {key}={mine!r}: {key} is an option "
                                 "of the whole optimizer, not a hyper of a group")
