"""fusedopt for PyTorch: ``fusedopt.torch.Optimizer``, a ``torch.optim.Optimizer`` that runs
any rule (a preset name, a rule's text or a ``fusedopt.Rule``) as one fused kernel over
every parameter that has a gradient: CPU tensors on the host kernel, CUDA tensors on the GPU
kernel, on torch's current stream.

- Param groups keep torch's keys (``lr``, ``betas``, ``weight_decay``, ...) so LR schedulers
  and user code work unchanged; a changed value reaches the kernel at the next step without
  a recompile.
- ``state_dict()`` / ``load_state_dict()`` use torch's layout and state names
  (``exp_avg``, ``exp_avg_sq``, ``step``, ...): a ``torch.optim.AdamW`` checkpoint loads into
  ``rule="adamw"`` and back. ``from_torch(optimizer)`` converts a live torch optimizer.
- AMP: ``_step_supports_amp_scaling``: a GradScaler hands over ``grad_scale`` and
  ``found_inf``; the unscale and the skip happen in the fused kernel, with no host
  synchronisation on CUDA.
"""

import collections
import collections.abc
import contextlib
import math
import numbers
import operator
import sys
import warnings
import weakref

import torch

from . import _fusedopt as _C
from . import rule as _rule
from ._state import Edits as _Edits, StateEntry as _StateEntry, StateTable as _StateTable
from .errors import UsageError

__all__ = ["Optimizer", "from_torch", "TORCH_PRESETS"]

# torch.optim class -> preset, with the torch names of the rule's states where they differ.
TORCH_PRESETS = {
    "SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad", "RMSprop": "rmsprop",
    "Adamax": "adamax", "NAdam": "nadam", "RAdam": "radam", "Adadelta": "adadelta",
    "Rprop": "rprop", "ASGD": "asgd", "Adafactor": "adafactor",
}
_STATE_NAMES = {  # rule state -> torch state, per preset base
    "adam": {"m": "exp_avg", "v": "exp_avg_sq", "max_v": "max_exp_avg_sq"},
    "adamw": {"m": "exp_avg", "v": "exp_avg_sq", "max_v": "max_exp_avg_sq"},
    "adamax": {"m": "exp_avg"},
    "nadam": {"m": "exp_avg", "v": "exp_avg_sq", "mu_prod": "mu_product"},
    "radam": {"m": "exp_avg", "v": "exp_avg_sq"},
    "adafactor": {"r": "row_var", "c": "col_var"},
}
# torch's tuple-valued hypers and the rule hypers they hold.
_TUPLES = {
    "betas": ("beta1", "beta2"),
    "etas": ("etaminus", "etaplus"),
    "step_sizes": ("step_size_min", "step_size_max"),
    "eps": ("eps1", "eps2"),  # Adafactor's (eps1, eps2); a plain eps elsewhere
}
# Group keys torch (or its schedulers) keep that no rule reads.
# The constructor's options: of the whole optimizer, not hypers. A wrapper that copies its
# keyword arguments into every param group (torch's ZeroRedundancyOptimizer does) may leave
# them there: a group may carry one only with the optimizer's own value.
_OPTIONS = ("rule", "state_dtype", "master_weights", "max_grad_norm", "reduction_strategy",
            "process_group", "state_storage", "quant_block", "quant_min_numel",
            "stochastic_rounding", "seed")
_IGNORED = {"params", "param_names", "foreach", "capturable", "differentiable", "fused",
            "initial_lr", "amsgrad", "name"}
_GRAD = operator.attrgetter("grad")
_DATA_PTR = torch.Tensor.data_ptr


def _none_ref():  # the last step's "weak reference" to a grad that was None
    return None


def _grad_ptr(grad):
    return 0 if grad is None else grad.data_ptr()


_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_TORCH_DTYPES = {code: dtype for dtype, code in _DTYPES.items()}
_INT_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
# States torch's class leaves out while a hyper of the param's group is 0 (RMSprop keeps no
# momentum_buffer without momentum, no grad_avg unless centered): torch state -> that hyper.
_UNUSED_WHEN_ZERO = {
    "sgd": {"momentum_buffer": "momentum"},
    "rmsprop": {"momentum_buffer": "momentum", "grad_avg": "centered"},
}
_MAX_STEPS = 2**53  # the C++ Optimizer's bound on a step count


def _dtype_code(dtype, who):
    if dtype not in _DTYPES:
        raise UsageError(f"{who} has dtype {dtype}; fusedopt binds float32, float16 and "
                         "bfloat16")
    return _DTYPES[dtype]


def _float(value, key, none_is_zero=False):
    if type(value) is float:  # the common case, every step: no checks to make
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise UsageError(f"hyper '{key}' is a tensor of {value.numel()} elements; "
                             "give one number")
        value = value.item()
    if value is None and none_is_zero:  # torch's Adafactor: eps=(None, 1e-3), eps1 = 0
        return 0.0
    if not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise UsageError(f"hyper '{key}' is {value!r} (a {type(value).__name__}); a hyper is a "
                     "number (booleans as 0/1)")


def _int_option(name, value, high, low=None):
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


def _check_torch_ranges(group):
    """torch.optim's own checks of its constructors' hypers, with its messages: lr, eps,
    weight_decay and momentum not negative, each beta in [0, 1)."""
    def number(v):
        return float(v.item() if isinstance(v, torch.Tensor) else v)

    for key, what in (("lr", "learning rate"), ("weight_decay", "weight_decay value"),
                      ("momentum", "momentum value")):
        if group.get(key) is not None and not 0.0 <= number(group[key]):
            raise ValueError(f"Invalid {what}: {group[key]}")
    eps = group.get("eps")
    for e in eps if isinstance(eps, (tuple, list)) else (eps,):
        if e is not None and not 0.0 <= number(e):
            raise ValueError(f"Invalid epsilon value: {eps}")
    betas = group.get("betas")
    if isinstance(betas, (tuple, list)):
        for i, b in enumerate(betas):
            if not 0.0 <= number(b) < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")


class _Bound:
    """One C++ optimizer (engine) over a set of params that share a step count, and what
    it was last pointed at (so that a step finds moved tensors cheaply)."""

    def __init__(self, engine, params, grads, slots):
        self.engine = engine
        self.params = params  # [(group index, index in group, param)]
        self.tensors = [p for _, _, p in params]
        self.device = self.tensors[0].device
        self.dtypes = [p.dtype for p in self.tensors]
        self.shapes = [p.shape for p in self.tensors]
        # The grads it was pointed at, held weakly: zero_grad(set_to_none=True) must free
        # them before the next backward, as it does without fusedopt.
        self.grads = [weakref.ref(g) for g in grads]
        self.pptrs = [p.data_ptr() for p in self.tensors]
        self.gptrs = [g.data_ptr() for g in grads]
        self.slots = slots  # index in the engine of each param


def _zero_process_group():
    """The process group of a torch ZeroRedundancyOptimizer that is building this optimizer
    over its rank's shard (it keeps `process_group` for itself), else None."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:
        return None
    frame = sys._getframe(2)  # past this function and Optimizer.__init__
    for _ in range(8):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, ZeroRedundancyOptimizer):
            return getattr(owner, "process_group", None)
        frame = frame.f_back
    return None


def _reduction_hook(optimizer):
    """The engine's hook for `optimizer`'s process group, holding the optimizer weakly (the
    engine it is set on belongs to the optimizer)."""
    ref = weakref.ref(optimizer)

    def hook(pass_, stage, totals, slots, tensor_totals, shard, shard_max, stream):
        # Whole params only here (no pieces): no shard, no stage 1 call; per-tensor totals
        # stay local (see _combine).
        owner = ref()
        if owner is not None:
            _combine(owner._process_group, totals, slots, stream)
    return hook


def _combine(group, totals, slots, stream):
    """One pass's global totals of every rank of `group`, combined in place: gathered in one
    collective (float64), then summed in rank order, or the max where the slot says so.
    Per-tensor totals stay local: each param lives whole on one rank."""
    glob = [(index, by_max) for _, per_tensor, index, by_max in slots if not per_tensor]
    if not glob:
        return
    world = torch.distributed.get_world_size(group)
    on_stream = contextlib.nullcontext()
    if totals.is_cuda:  # ordered after the pass that wrote them, on the optimizer's stream
        cuda_stream = torch.cuda.ExternalStream(stream) if stream else \
            torch.cuda.default_stream(totals.device)
        on_stream = torch.cuda.stream(cuda_stream)
    with on_stream:
        parts = [torch.empty_like(totals) for _ in range(world)]
        torch.distributed.all_gather(parts, totals.clone(), group=group)
        every = torch.stack(parts)
        for index, by_max in glob:
            column = every[:, index]
            totals[index] = column.max() if by_max else column.sum()


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


class Optimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` running ``rule`` as one fused kernel per step.

    ``rule``: a preset name ('adamw', 'sgd', 'adamw+amsgrad', ...), a rule's text, or a
    ``fusedopt.Rule``. Keyword hypers use the rule's names or torch's (``betas=(0.9, 0.999)``
    for ``beta1``/``beta2``, ``etas``, ``step_sizes``; booleans as 0/1; ``amsgrad=True``
    picks the preset option). ``state_dtype`` (torch.float32, torch.bfloat16 or
    torch.float16) stores the states; ``master_weights`` keeps an fp32 copy of 16-bit params;
    ``max_grad_norm`` clips by the global norm inside the same launches (torch's
    ``clip_grad_norm_``; a rule that clips by itself, as lamb, takes it as its hyper). These
    options belong to the whole optimizer; a wrapper may copy them into every param group with
    the same values. ``process_group`` (a torch.distributed group) says the params are this
    rank's shard of a model whose other shards the group's ranks hold: global reductions (the
    clipping norm, LAMB's global terms, the non-finite check) then span the group, one
    collective per reduction pass; per-tensor terms stay local (each param lives whole on one
    rank). Inside torch's ZeroRedundancyOptimizer, which keeps its own ``process_group``
    argument and builds this optimizer over its shard, its group is taken without being given.
    ``state_storage`` block-quantizes states: a kind for every state ('q8', 'q4', 'q8s',
    'q8u', 'q4s', 'q4u'; with '+sr', as 'q4u+sr', its codes are rounded stochastically from
    the generator keyed on ``seed``) or a dict of state name (the rule's) to kind;
    ``quant_block`` elements
    share an absmax (0: 256, 128 with a 4-bit state); params below ``quant_min_numel``
    elements keep plain states. A quantized state shows in ``state[p]`` as its codes
    (torch.uint8) and ``NAME.absmax``; presets such as 'adamw8bit' declare their own storage.
    ``stochastic_rounding`` stores float16/bfloat16 params (without master weights) rounded
    stochastically, from a counter-based generator keyed on ``seed``, the step, the param and
    the element: the same bits on any thread count or layout.
    """

    _step_supports_amp_scaling = True

    def __init__(self, params, rule="adamw", *, state_dtype=torch.float32, master_weights=False,
                 max_grad_norm=0.0, reduction_strategy="auto", process_group=None,
                 state_storage=None, quant_block=0, quant_min_numel=4096,
                 stochastic_rounding=False, seed=0, **hypers):
        self._given = {"rule": rule, "state_dtype": state_dtype, "master_weights": master_weights,
                       "max_grad_norm": max_grad_norm, "reduction_strategy": reduction_strategy,
                       "state_storage": state_storage, "quant_block": quant_block,
                       "quant_min_numel": quant_min_numel,
                       "stochastic_rounding": stochastic_rounding, "seed": seed}
        if process_group is None:
            process_group = _zero_process_group()
        elif not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise UsageError("process_group is given, but torch.distributed is not initialized "
                             "(call torch.distributed.init_process_group first)")
        self._process_group = process_group
        self._given["process_group"] = process_group
        preset_base = None
        if isinstance(rule, str) and rule.split("+")[0] in _C.Rule.presets():
            # A preset: its options (amsgrad=True) may come as keyword hypers, as in torch.
            parts = rule.split("+")
            preset_base, chosen = parts[0], set(parts[1:])
            for option in _C.Rule.preset_options(preset_base):
                if option in hypers:
                    (chosen.add if bool(hypers.pop(option)) else chosen.discard)(option)
            rule = "+".join([preset_base] + sorted(chosen))
        self._rule = _rule(rule)
        self._preset = preset_base
        self._check_rule_options("Optimizer", hypers)
        self._names = dict(_STATE_NAMES.get(self._preset, {}))
        self._rule_defaults = dict(self._rule.hypers)
        self._hyper_names = list(self._rule_defaults)
        if "max_grad_norm" in self._rule_defaults:
            # The rule clips by itself (lamb): the keyword is its hyper, not the option.
            if float(max_grad_norm) != 0.0:
                hypers.setdefault("max_grad_norm", max_grad_norm)
            max_grad_norm = 0.0
            del self._given["max_grad_norm"]
        # The options a group may carry (with the optimizer's value): not the rule's hypers.
        self._option_names = tuple(k for k in _OPTIONS if k not in self._rule_defaults)
        self._options = {
            "state_dtype": _dtype_code(state_dtype, "state_dtype") if not isinstance(
                state_dtype, str) else state_dtype,
            "master_weights": bool(master_weights),
            "max_grad_norm": float(max_grad_norm),
            "strategy": str(reduction_strategy),
            "state_storage": _storage_pairs(state_storage),
            "quant_block": _int_option("quant_block", quant_block, 2**31 - 1),
            "quant_min_numel": _int_option("quant_min_numel", quant_min_numel, 2**63 - 1),
            "stochastic_rounding": bool(stochastic_rounding),
            # A negative seed stands for its 64-bit two's complement.
            "seed": _int_option("seed", seed, 2**64 - 1, low=-2**63) % 2**64,
        }
        # The options checked as the first step would check them (UsageError naming the
        # first bad one), and each state's storage ('-' or a kind) where a param is quantized.
        o = self._options
        self._storage = dict(zip(self._rule.states, _C.check_options(
            self._rule, o["state_dtype"], o["master_weights"], o["max_grad_norm"],
            o["strategy"], o["state_storage"], o["quant_block"], o["quant_min_numel"],
            o["stochastic_rounding"], o["seed"])))
        defaults = self._defaults(hypers)
        if preset_base is not None:
            for option in _C.Rule.preset_options(preset_base):  # torch's group keys
                defaults[option] = option in self._rule.name.split("+")[1:]
        self._engines = []
        self._key = None
        # Every param, its grad (weakly) and its address as the last step left them.
        self._last = None
        self._steps = {}  # param -> steps taken, for params outside an engine
        self._pushed = []  # per engine: the hypers last given to it, per group
        self.engine_builds = 0
        # What _build put in opt.state for each param, to tell user edits from it: param ->
        # (its StateEntry, the entry's items as put there); and the param's shape then.
        self._installed = {}
        self._state_shapes = {}
        super().__init__(params, defaults)
        self._edits = _Edits()  # opt.state noticing edits (see _state.py)
        self._table = _StateTable(self._edits, self.state)
        self.state = self._table

    # ---- hypers ---------------------------------------------------------------------------
    def _defaults(self, hypers):
        rule_defaults = dict(self._rule.hypers)
        defaults = {}
        # Torch's tuple keys where the rule has the whole tuple (the preset's torch face).
        covered, tuples = set(), set()
        for key, names in _TUPLES.items():
            if all(n in rule_defaults for n in names) and (key in hypers or self._preset):
                defaults[key] = tuple(rule_defaults[n] for n in names)
                covered.update(names)
                tuples.add(key)
        for name, value in rule_defaults.items():
            if name not in covered:
                defaults[name] = value
        if self._preset == "adafactor" and "eps" in defaults:
            defaults["eps"] = (None, defaults["eps"][1])  # torch's: None for eps1 = 0
        for key, value in hypers.items():
            if key in _IGNORED:
                continue
            if key in tuples:
                if not isinstance(value, (tuple, list)) or len(value) != len(_TUPLES[key]):
                    raise UsageError(f"hyper '{key}' must be a tuple of {len(_TUPLES[key])} "
                                     f"({', '.join(_TUPLES[key])})")
                defaults[key] = tuple(value)
            elif key in defaults:
                defaults[key] = value
            elif key in rule_defaults:  # a rule name for a part of a tuple key
                for tkey, names in _TUPLES.items():
                    if key in names and tkey in tuples:
                        parts = list(defaults[tkey])
                        parts[names.index(key)] = value
                        defaults[tkey] = tuple(parts)
            else:
                raise UsageError(f"rule '{self._rule.name}' has no hyper '{key}' (it has: "
                                 f"{', '.join(self._hyper_names) or 'none'})")
        return defaults

    def _group_hypers(self, group):
        """The rule's hypers of one group, in the rule's order, as floats."""
        out = []
        for name in self._hyper_names:
            if name in group:
                out.append(_float(group[name], name))
                continue
            for key, names in _TUPLES.items():
                if name not in names or key not in group:
                    continue
                value = group[key]
                if isinstance(value, (tuple, list)) and len(value) == len(names):
                    out.append(_float(value[names.index(name)], key, none_is_zero=key == "eps"))
                    break
                if isinstance(value, (tuple, list)) or isinstance(self.defaults.get(key), tuple):
                    raise UsageError(f"hyper '{key}' is {value!r}; it must be a tuple of "
                                     f"{len(names)} ({', '.join(names)})")
            else:
                out.append(_float(self.defaults.get(name, self._rule_defaults[name]), name))
        return out

    def add_param_group(self, param_group):
        # The library's rule for a hyper's value, checked here too so that construction
        # refuses what the first step would (as torch refuses a NaN lr); before the group is
        # added, so a refused group changes nothing.
        group = {**self.defaults, **param_group}
        self._check_rule_options(f"add_param_group: param group {len(self.param_groups)}", group)
        self._check_group_options("add_param_group", len(self.param_groups), group)
        self._check_torch_types(len(self.param_groups), group)
        self._check_group_hypers("Optimizer", len(self.param_groups), group)
        if self._preset is not None:
            _check_torch_ranges(group)
        super().add_param_group(param_group)
        for key in param_group:
            if key in _IGNORED or key in self._option_names or key in self.defaults or \
                    key in self._hyper_names:
                continue
            raise UsageError(f"param group {len(self.param_groups) - 1}: rule "
                             f"'{self._rule.name}' has no hyper '{key}' (it has: "
                             f"{', '.join(self._hyper_names) or 'none'})")
        self._key = None  # the next step plans again

    def _check_rule_options(self, where, group):
        """A preset option given as a hyper (torch's amsgrad) must agree with the rule the
        optimizer runs: it picks the rule, for the whole optimizer."""
        name = self._rule.name
        offered = set(_C.Rule.preset_options(self._preset)) if self._preset else set()
        chosen = set(name.split("+")[1:]) if self._preset else set()
        for key in sorted(offered | {"amsgrad"}):
            value = group.get(key)
            if value is None or bool(value) == (key in chosen):
                continue
            if key in offered:
                raise UsageError(f"{where}: {key}={value!r}, but the optimizer runs '{name}': "
                                 f"{key} picks the rule of the whole optimizer (build it with "
                                 f"{key}={bool(value)})")
            having = sorted({b.split("+")[0] for b in _C.Rule.presets()
                             if key in _C.Rule.preset_options(b.split("+")[0])})
            raise UsageError(f"{where}: {key}={value!r}, but rule '{name}' has no {key} option "
                             f"(the presets {', '.join(having)} have it)")

    def _check_group_options(self, where, g, group):
        """A group may carry an option (copied in by a wrapper) only with the optimizer's
        own value."""
        for key in self._option_names:
            if key not in group:
                continue
            value, mine = group[key], self._given[key]
            if key == "state_dtype":
                same = value == mine or (not isinstance(value, str) and
                                         _DTYPES.get(value) == self._options["state_dtype"])
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

    def _check_torch_types(self, g, group):
        """A hyper that is not a number is a TypeError at construction, as in torch.optim
        (whose range checks compare it with a number)."""
        for key, value in group.items():
            if key in _IGNORED or key in self._option_names:
                continue
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if v is not None and not isinstance(v, (numbers.Real, torch.Tensor)):
                    raise TypeError(f"param group {g}: hyper '{key}' is {v!r} (a "
                                    f"{type(v).__name__}); a hyper is a number")

    def _check_group_hypers(self, where, g, group):
        """Group g's hypers as the kernel will read them: torch's tuple keys of the right
        length, every hyper a number that passes the library's check_hyper_value."""
        for key, names in _TUPLES.items():
            if key in group and isinstance(self.defaults.get(key), tuple):
                value = group[key]
                if not isinstance(value, (tuple, list)) or len(value) != len(names):
                    raise UsageError(f"{where}: param group {g}: hyper '{key}' is {value!r}; it "
                                     f"must be a tuple of {len(names)} ({', '.join(names)})")
        try:
            values = self._group_hypers(group)
        except UsageError as e:
            raise UsageError(f"{where}: param group {g}: {e}") from None
        for name, value in zip(self._hyper_names, values):
            _C.check_hyper_value(where, name, g, value)
        return dict(zip(self._hyper_names, values))

    # ---- planning -------------------------------------------------------------------------
    def _who(self, g, i, p=None):
        return f"param_groups[{g}]['params'][{i}]" + (f" (shape {tuple(p.shape)})" if p is not None
                                                     else "")

    def _check(self, g, i, p, grad, device):
        who = self._who(g, i, p)
        if grad.is_sparse:
            raise UsageError(f"{who}: its gradient is sparse; fusedopt takes dense gradients "
                             "(torch.optim.SparseAdam handles sparse ones)")
        if p.is_complex() or grad.is_complex():
            raise UsageError(f"{who}: complex tensors are not supported (use "
                             "torch.view_as_real)")
        _dtype_code(p.dtype, who)
        _dtype_code(grad.dtype, f"{who}.grad")
        for t, what in ((p, "it"), (grad, "its gradient")):
            if getattr(t, "is_neg", None) is not None and t.is_neg():
                raise UsageError(f"{who}: {what} is a lazily negated view (its memory holds "
                                 "the values' negatives); call .resolve_neg() on it")
        if grad.shape != p.shape:
            raise UsageError(f"{who}: its gradient has shape {tuple(grad.shape)}")
        if p.device != device or grad.device != device:
            raise UsageError(f"{who}: on {p.device} (grad on {grad.device}), but the first "
                             f"parameter with a gradient is on {device}: one fusedopt "
                             "Optimizer steps the parameters of one device")
        if not p.is_contiguous():
            raise UsageError(f"{who}: not contiguous (strides {p.stride()}); fusedopt walks "
                             "each parameter's memory in order")
        if not grad.is_contiguous():
            raise UsageError(f"{who}: its gradient is not contiguous (strides "
                             f"{grad.stride()})")
        if p.device.type not in ("cpu", "cuda"):
            raise UsageError(f"{who}: on {p.device}; fusedopt runs on the CPU and on CUDA")

    def _active(self):
        return [(g, i, p) for g, group in enumerate(self.param_groups)
                for i, p in enumerate(group["params"]) if p.grad is not None]

    def _step_of(self, p):
        return self._steps.get(p, 0)

    def _release(self):
        """Takes the state out of the engines (copies), so they can go."""
        for bound in self._engines:
            taken = bound.engine.step_count()
            for _, _, p in bound.params:
                self._steps[p] = taken
                state = self._watched(p)
                for key, t in list(state.items()):
                    if isinstance(t, torch.Tensor):
                        dict.__setitem__(state, key, t.clone())
                self._installed[p] = (state, dict(state))
        self._engines = []
        self._pushed = []
        self._key = None

    def _watched(self, p):
        """p's entry in opt.state as a StateEntry (edits of it noticed), put there if it was
        another dict or none."""
        entry = dict.get(self.state, p)
        if not isinstance(entry, _StateEntry):
            entry = _StateEntry(self._edits, entry or {})
            dict.__setitem__(self.state, p, entry)
        return entry

    def _plan(self, active):
        for g, i, p in active:  # before anything changes: a refusal leaves the engines
            made = self._state_shapes.get(p)
            if made is not None and made != tuple(p.shape) and any(
                    isinstance(v, torch.Tensor) for v in dict.get(self.state, p, {}).values()):
                raise UsageError(f"{self._who(g, i)}: its shape changed from {made} to "
                                 f"{tuple(p.shape)} since its state was made; start its state "
                                 "again (opt.state[p] = {}) or load a state of the new shape")
        self._release()
        device = active[0][2].device
        for g, i, p in active:
            self._check(g, i, p, p.grad, device)
        for g, i, p in active:  # a count set in opt.state[p]['step'] (a param joining others)
            entry = dict.get(self.state, p)
            if entry and "step" in entry:
                self._steps[p] = self._loaded_step(i, entry["step"],
                                                   f"opt.state of {self._who(g, i)}")
                dict.pop(entry, "step")
        # One engine per step count (params that skipped steps have their own), in order.
        by_step = {}
        for g, i, p in active:
            by_step.setdefault(self._step_of(p), []).append((g, i, p))
        if len(by_step) > 1 and (self._rule.reduction_passes > 0
                                 or self._options["max_grad_norm"] > 0):
            counts = ", ".join(str(s) for s in sorted(by_step))
            raise UsageError(f"rule '{self._rule.name}' reduces over every tensor of a step, "
                             f"but the parameters with gradients have taken different numbers "
                             f"of steps ({counts}); step them together: give every parameter a "
                             "gradient at every step (zeros for a frozen one), or give one "
                             "that joins later the others' count before its first step "
                             "(opt.state[p]['step'] = N)")
        for steps, members in by_step.items():
            self._engines.append(self._build(members, steps))
        self._key = [p for _, _, p in active]  # compared by identity
        self._edits.changed = False  # the writes above were ours

    def _build(self, members, steps):
        specs = []
        for g, group in enumerate(self.param_groups):
            spec = _C._GroupSpec()
            spec.hypers = list(zip(self._hyper_names, self._group_hypers(group)))
            specs.append(spec)
        params, grads, slots = [], [], []
        lists = [([], [], []) for _ in self.param_groups]
        for g, i, p in members:
            lists[g][0].append(p.detach())
            lists[g][1].append(p.grad.detach())
            lists[g][2].append(f"group{g}.param{i}")
        for g, spec in enumerate(specs):
            spec.params, spec.grads, spec.names = lists[g]
        # The engine's param order: by group, then as listed.
        ordered = sorted(members, key=lambda m: (m[0], m[1]))
        engine = _C._Engine(self._rule, specs, self._options["state_dtype"],
                            self._options["master_weights"], self._options["max_grad_norm"],
                            self._options["strategy"], self._options["state_storage"],
                            self._options["quant_block"], self._options["quant_min_numel"],
                            self._options["stochastic_rounding"], self._options["seed"])
        if self._process_group is not None and \
                torch.distributed.get_world_size(self._process_group) > 1:
            engine.set_reduction_hook(_reduction_hook(self))
        self.engine_builds += 1
        for slot, (g, i, p) in enumerate(ordered):
            params.append((g, i, p))
            grads.append(p.grad)
            slots.append(slot)
            old = dict.get(self.state, p) or {}
            fresh = self._views(engine, slot, p)
            for key, view in fresh.items():
                if key in old and isinstance(old[key], torch.Tensor):
                    view.copy_(old[key].reshape(view.shape))
            entry = _StateEntry(self._edits, fresh)
            dict.__setitem__(self.state, p, entry)
            self._installed[p] = (entry, fresh)
            self._state_shapes[p] = tuple(p.shape)
        if steps:
            engine.set_step_count(int(steps))
        self._pushed.append([self._group_hypers(group) for group in self.param_groups])
        return _Bound(engine, params, grads, slots)

    def _views(self, engine, slot, p):
        """The engine's state of one param as torch tensors (views, no copy), torch names."""
        out = {}
        shape = list(p.shape) or [1]
        rows = shape[:-1] + [1] if len(shape) >= 2 else shape
        cols = shape[:-2] + [1, shape[-1]] if len(shape) >= 2 else [1]
        # The engine's one table of states (Optimizer::states()), by kind; outputs are
        # scratch of a step, not state torch would keep.
        for name, kind in engine.states():
            key = self._names.get(name, name)
            if kind == "element":
                view = engine.state(name, slot, "flat")
                # 8-bit codes keep the param's shape; 4-bit ones are two per byte, flat
                # (even where that is one byte per element: a param of one element).
                if view.dtype != torch.uint8 or \
                        not self._storage.get(name, "-").startswith("q4"):
                    view = view.view(p.shape)
                out[key] = view
            elif kind == "absmax":
                base = name[:-len(".absmax")]
                view = engine.state(name, slot, "flat")
                if view.numel():  # this param's state is quantized
                    out[self._names.get(base, base) + ".absmax"] = view
            elif kind == "scalar":
                out[key] = engine.state(name, slot, "scalar")
            elif kind == "row":
                # torch's Adafactor keeps a 1-D param's full variance as "variance": our row
                # state of its numel rows.
                if self._preset == "adafactor" and p.dim() < 2:
                    key = "variance"
                out[key] = engine.state(name, slot, "flat").view(rows)
            elif kind == "col":
                out[key] = engine.state(name, slot, "flat").view(cols)
            elif kind == "master" and p.dtype != torch.float32:
                out["master"] = engine.state("master", slot, "param")
        return out

    def _rebind_moved(self, bound, stream):
        """Re-points the engine at grads (and params) that moved since the last step; False
        when one changed its dtype or shape (the caller plans again)."""
        grads = [p.grad for p in bound.tensors]
        pptrs = [p.data_ptr() for p in bound.tensors]
        gptrs = [g.data_ptr() for g in grads]
        last = [ref() for ref in bound.grads]
        if pptrs == bound.pptrs and gptrs == bound.gptrs and all(map(operator.is_, grads, last)):
            return True  # the steady state: nothing moved
        new_params, new_grads = [], []
        for k, (g, i, p) in enumerate(bound.params):
            # A grad moves as a new tensor, or as the same one given new memory (its .data
            # set, as nn.Module.to() and share_memory() do to grads that are kept).
            grad = grads[k]
            moved_p, moved_g = pptrs[k] != bound.pptrs[k], gptrs[k] != bound.gptrs[k]
            if grad is not last[k] or moved_g:
                if grad.dtype != bound.dtypes[k] or grad.shape != bound.shapes[k]:
                    return False
            if moved_p and (p.dtype != bound.dtypes[k] or p.shape != bound.shapes[k]):
                return False
            if moved_p:
                self._check(g, i, p, grad, bound.device)
            elif moved_g and (grad.is_sparse or grad.device != bound.device or
                              not grad.is_contiguous()):
                self._check(g, i, p, grad, bound.device)  # raises, saying which and why
            new_params.append(pptrs[k] if moved_p else 0)
            new_grads.append(grad.data_ptr() if moved_g else 0)
        bound.engine.rebind(new_params, new_grads, stream)
        # Committed only once the engine took them (a refusal changes nothing).
        bound.grads = [weakref.ref(g) for g in grads]
        bound.pptrs = pptrs
        bound.gptrs = gptrs
        return True

    def _unmoved(self, flat, grads):
        """True when every param and grad is the object, and at the address, it was at the
        end of the last step (so the engines point at them all): the per-tensor work of a
        steady step is this one check."""
        last = self._last
        return (self._key is not None and last is not None and len(flat) == len(last[0])
                and all(map(operator.is_, flat, last[0]))
                and all(map(operator.is_, grads, [ref() for ref in last[1]]))
                and list(map(_DATA_PTR, flat)) == last[2]
                and list(map(_grad_ptr, grads)) == last[3])

    def _follow(self, with_grad, stream):
        """Plans again when the params with grads changed; else re-points each engine at
        moved params and grads (planning again when one changed its dtype or shape)."""
        if self._key is None or len(with_grad) != len(self._key) or \
                not all(map(operator.is_, with_grad, self._key)):
            self._plan(self._active())
            return
        for bound in self._engines:
            if not self._rebind_moved(bound, stream):
                self._plan(self._active())
                return

    def _adopt_state(self):
        """Takes edits of opt.state made since the engines' views were put there, as torch
        reads its state at every step: a param whose entry is gone or holds none of its
        states starts again (step 0, every state from its initial value); a state given a new
        tensor goes on from its values (checked as load_state_dict checks one; a 'step' sets
        the step count); a state deleted from an entry starts from its initial value. The
        engines are built again at this step. All or nothing: a refused edit changes
        nothing."""
        if self.state is not self._table:  # the whole table replaced
            self._table = _StateTable(self._edits, self.state)
            self.state = self._table
        where = {p: (g, i) for g, group in enumerate(self.param_groups)
                 for i, p in enumerate(group["params"])}
        taken = {}  # param -> (step or None, checked new tensors), or None: start again
        for p, (entry, views) in list(self._installed.items()):
            now = dict.get(self.state, p)
            if p not in where:
                continue  # no longer in a group: no step reads it
            if now is not None and "step" not in now and \
                    all(now.get(key) is view for key, view in views.items()):
                if now is not entry:  # the same views in a new dict: watched from now on
                    entry = _StateEntry(self._edits, now)
                    dict.__setitem__(self.state, p, entry)
                    self._installed[p] = (entry, views)
                continue  # untouched (or only keys no rule reads changed)
            if now is None or ("step" not in now and not any(key in now for key in views)):
                taken[p] = None
                continue
            g, i = where[p]
            who = f"opt.state of {self._who(g, i)}"
            hypers = dict(zip(self._hyper_names, self._group_hypers(self.param_groups[g])))
            expected = self._expected_states(p, hypers, set())
            step, new = None, {}
            for key, value in now.items():
                if key == "step":
                    step = self._loaded_step(i, value, who)
                elif key in expected and value is not None and value is not views.get(key):
                    new[key] = self._loaded_state(i, key, value, p, expected[key], who)
            taken[p] = (step, new)
        self._edits.changed = False  # taken (a refused edit is seen again at the next step)
        if not taken:
            return
        self._release()  # the engines' states copied into opt.state, then the edits on top
        for p, change in taken.items():
            if change is None:
                entry = _StateEntry(self._edits)
                dict.__setitem__(self.state, p, entry)
                self._steps[p] = 0
            else:
                step, new = change
                entry = self._watched(p)
                dict.update(entry, new)
                dict.pop(entry, "step", None)
                if step is not None:
                    self._steps[p] = step
            self._installed[p] = (entry, dict(entry))
        self._edits.changed = False

    def _stream(self, device):
        if device.type == "cuda":
            return torch.cuda.current_stream(device).cuda_stream
        return 0

    # ---- the step -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """One fused step over every parameter with a gradient (those without are skipped,
        as torch skips them). Under a GradScaler, the scale and the inf check it passes are
        applied in the kernel."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = self._amp_inputs(kwargs.pop("grad_scaler", None))
        if kwargs:
            raise TypeError(f"step() got unexpected keyword arguments {sorted(kwargs)}")
        if self._edits.changed or self.state is not self._table:
            self._adopt_state()
        flat = [p for group in self.param_groups for p in group["params"]]
        grads = list(map(_GRAD, flat))
        if self._unmoved(flat, grads):  # the steady state: one pass, nothing to re-point
            stream = self._stream(self._engines[0].device)
        else:
            with_grad = [p for p, g in zip(flat, grads) if g is not None]
            if not with_grad:
                return loss
            stream = self._stream(with_grad[0].device)
            self._follow(with_grad, stream)
            self._last = (flat, [_none_ref if g is None else weakref.ref(g) for g in grads],
                          list(map(_DATA_PTR, flat)), list(map(_grad_ptr, grads)))
        for g, group in enumerate(self.param_groups):
            self._check_group_options("step", g, group)
        try:
            hypers = [self._group_hypers(group) for group in self.param_groups]
        except UsageError:  # say which group
            for g, group in enumerate(self.param_groups):
                try:
                    self._group_hypers(group)
                except UsageError as e:
                    raise UsageError(f"step: param group {g}: {e}") from None
            raise
        for e, bound in enumerate(self._engines):
            for g, values in enumerate(hypers):
                if values != self._pushed[e][g]:
                    for name, new, old in zip(self._hyper_names, values, self._pushed[e][g]):
                        if new != old:
                            bound.engine.set_hyper(name, new, g,
                                                   stream if bound.engine.device >= 0 else None)
                    self._pushed[e][g] = values
            if grad_scale is None and found_inf is None:
                bound.engine.step(stream)
            else:
                bound.engine.step_amp(grad_scale, found_inf, stream)
        return loss

    def _amp_inputs(self, scaler):
        """grad_scale and found_inf as torch's GradScaler hands them over (attributes set
        for this step), or read from a scaler passed as `grad_scaler` (torch 1.13's form)."""
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if scaler is not None and grad_scale is None and found_inf is None:
            state = scaler._per_optimizer_states[id(self)]
            if state["stage"].name == "READY":
                scaler._check_inf_per_device(self)
            scale = scaler._get_scale_async()
            found_inf = sum(t.to(scale.device, non_blocking=True)
                            for t in state["found_inf_per_device"].values())
            grad_scale = None if state["stage"].name == "UNSCALED" else scale
        prepared = []
        for name, t in (("grad_scale", grad_scale), ("found_inf", found_inf)):
            if t is not None:
                if not isinstance(t, torch.Tensor) or t.numel() != 1:
                    raise UsageError(f"{name} must be a tensor of one element")
                t = t.detach().reshape(()).to(torch.float32)
            prepared.append(t)
        return prepared[0], prepared[1]

    # ---- state_dict -----------------------------------------------------------------------
    def _sync_steps(self):
        for bound in self._engines:
            taken = bound.engine.step_count()
            for _, _, p in bound.params:
                self._steps[p] = taken

    def state_dict(self):
        """torch's layout: {'state': {index: {name: tensor, 'step': tensor}},
        'param_groups': [...]}, with torch's state names."""
        self._sync_steps()
        index, groups = 0, []
        mapping = {}
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            ids = []
            for p in group["params"]:
                if id(p) not in mapping:
                    mapping[id(p)] = index
                    index += 1
                ids.append(mapping[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p not in self.state or not self.state[p]:
                    continue
                entry = {"step": torch.tensor(float(self._step_of(p)))}
                entry.update(self.state[p])
                state[mapping[id(p)]] = entry
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads torch's layout (from this class or from the torch.optim class of the same
        rule): hypers per group, states by torch's names, the step. All or nothing: the whole
        state dict is checked first (groups, hypers, every state's presence, shape and dtype,
        every step), then taken; a refused one raises UsageError (a ValueError) naming the
        group or parameter, the state and the problem, and leaves the optimizer as it was."""
        updates, states, steps, notes = self._read_state_dict(state_dict)
        for note in notes:  # before anything changes (a warning filter may raise)
            warnings.warn(note, stacklevel=2)
        self._release()
        for ours, update in zip(self.param_groups, updates):
            ours.update(update)
        self._table = _StateTable(self._edits)
        self.state = self._table
        self._installed = {}
        self._steps = steps
        for p, state in states.items():
            entry = _StateEntry(self._edits, state)
            dict.__setitem__(self.state, p, entry)
            self._installed[p] = (entry, dict(entry))
        self._state_shapes = {p: tuple(p.shape) for p, state in states.items() if state}
        self._key = None
        self._edits.changed = False

    def _read_state_dict(self, state_dict):
        """load_state_dict's reading and checking, changing nothing: per group the keys to
        set, per param its states (converted copies on its device), the steps, and the
        warnings to give."""
        who = "load_state_dict"
        if not isinstance(state_dict, collections.abc.Mapping) or \
                "param_groups" not in state_dict or "state" not in state_dict:
            raise UsageError(f"{who}: a state dict is a dict with 'state' and 'param_groups' "
                             f"(got {type(state_dict).__name__})")
        groups, saved = self.param_groups, state_dict["param_groups"]
        if not isinstance(saved, (list, tuple)) or not all(
                isinstance(t, collections.abc.Mapping) and
                isinstance(t.get("params"), (list, tuple)) for t in saved):
            raise UsageError(f"{who}: the state dict's 'param_groups' must be a list of dicts, "
                             "each with a list 'params'")
        if len(groups) != len(saved):
            raise UsageError(f"{who}: loaded state dict has a different number of parameter "
                             f"groups ({len(saved)}; this optimizer has {len(groups)})")
        for g, (ours, theirs) in enumerate(zip(groups, saved)):
            if len(ours["params"]) != len(theirs["params"]):
                raise UsageError(f"{who}: loaded state dict's group {g} has "
                                 f"{len(theirs['params'])} parameters, this optimizer's has "
                                 f"{len(ours['params'])}")
        by_index = {}  # saved index -> (group, param)
        updates, notes, hypers, optional = [], [], [], []
        options = set(self._rule.name.split("+")[1:]) if self._preset else set()
        for g, (ours, theirs) in enumerate(zip(groups, saved)):
            for i, p in zip(theirs["params"], ours["params"]):
                if not isinstance(i, numbers.Integral) or isinstance(i, bool):
                    raise UsageError(f"{who}: loaded state dict's group {g} lists parameter "
                                     f"{i!r}; parameters are listed by their integer index")
                if i in by_index:
                    raise UsageError(f"{who}: loaded state dict lists parameter {i} twice "
                                     f"(groups {by_index[i][0]} and {g})")
                by_index[i] = (g, p)
            update, off = {}, set()
            for key, value in theirs.items():
                if key == "params" or key in self._option_names:  # the optimizer's own decide
                    continue
                if self._preset and key in _C.Rule.preset_options(self._preset) and \
                        bool(value) != (key in options):
                    notes.append(f"load_state_dict: group {g} has {key}={value}, but this "
                                 f"optimizer runs '{self._rule.name}'; the rule decides (build "
                                 f"it with {key}={not value} to follow the checkpoint)")
                    if key in options:
                        off.add(key)
                    continue
                update[key] = value
            updates.append(update)
            hypers.append(self._check_group_hypers(who, g, {**ours, **update}))
            optional.append(self._states_of_options(off))
        if not isinstance(state_dict["state"], collections.abc.Mapping):
            raise UsageError(f"{who}: the state dict's 'state' must be a dict (parameter index "
                             "-> its states)")
        states, steps = {}, {}
        for i, entry in state_dict["state"].items():
            if i not in by_index:
                raise UsageError(f"{who}: loaded state dict has state for parameter {i!r}, "
                                 "which no group lists")
            if not isinstance(entry, collections.abc.Mapping):
                raise UsageError(f"{who}: the state of parameter {i} must be a dict of "
                                 f"states, not {type(entry).__name__}")
            g, p = by_index[i]
            expected = self._expected_states(p, hypers[g], optional[g])
            state = {}
            for key, value in entry.items():
                if key == "step":
                    steps[p] = self._loaded_step(i, value)
                elif value is None:
                    continue  # torch's SGD keeps momentum_buffer None without momentum
                elif key in expected:
                    state[key] = self._loaded_state(i, key, value, p, expected[key])
                # else: a state the rule does not keep (e.g. torch's unused ones)
            if "step" not in entry and state:
                # torch's SGD counts no steps: a param with a momentum buffer has stepped.
                steps[p] = 1
            if state or steps.get(p, 0):
                # A param has stepped: every state its rule reads must come with it (one
                # missing would start again from its initial value, silently).
                for key, (_, _, _, required) in expected.items():
                    if required and key not in state:
                        has = ", ".join(f"'{k}'" for k in entry if k != "step") or "no states"
                        keeps = ", ".join(f"'{k}'" for k, e in expected.items() if e[3])
                        raise UsageError(
                            f"{who}: parameter {i} has no state '{key}' (it has {has}, step "
                            f"{steps.get(p, 0)}); rule '{self._rule.name}' needs it for a "
                            f"parameter that has stepped (it keeps {keeps})")
            states[p] = state
        return updates, states, steps, notes

    def _states_of_options(self, options):
        """The torch names of the states that the preset options `options` add to the rule
        (a checkpoint made without the option has none of them)."""
        if not options:
            return set()
        kept = set(self._rule.name.split("+")[1:]) - set(options)
        without = _C.Rule.preset("+".join([self._preset] + sorted(kept)))
        names = set(without.states) | set(without.scalars) | set(without.row_states) | \
            set(without.col_states)
        return {self._names.get(n, n) for n in self._state_names() - names}

    def _quant_block(self):
        """Elements per absmax block (DTypeBinding::block): the option, else 256, or 128 with
        a 4-bit state."""
        if self._options["quant_block"]:
            return self._options["quant_block"]
        return 128 if any(k.startswith("q4") for k in self._storage.values()) else 256

    def _expected_states(self, p, hypers, optional):
        """The states of param p (torch's names) as _views will hold them: key -> (shapes
        accepted, dtype kept, what the shape is, required)."""
        shape = tuple(p.shape)
        flat = list(shape) or [1]
        rows = tuple(flat[:-1] + [1]) if len(flat) >= 2 else tuple(flat)
        cols = tuple(flat[:-2] + [1, flat[-1]]) if len(flat) >= 2 else (1,)
        unused = {key for key, hyper in _UNUSED_WHEN_ZERO.get(self._preset, {}).items()
                  if hypers.get(hyper, 1.0) == 0.0}
        out = {}
        state_dtype = _TORCH_DTYPES.get(self._options["state_dtype"])
        block = self._quant_block()
        n = p.numel()
        for name in self._rule.states:
            key = self._names.get(name, name)
            kind = self._storage.get(name, "-")
            if kind != "-" and 0 < n and n >= self._options["quant_min_numel"]:
                codes = {shape} if kind.startswith("q8") else {((n + 1) // 2,)}
                out[key] = (codes, torch.uint8, f"its codes have {min(codes)}", True)
                out[key + ".absmax"] = ({((n + block - 1) // block,)}, torch.float32,
                                        f"one absmax per {block} elements", True)
                continue
            out[key] = ({shape}, state_dtype, f"the parameter has {shape}", True)
        for name in self._rule.scalars:
            out[self._names.get(name, name)] = ({()}, torch.float64,
                                                "a scalar state has shape ()", True)
        for name in self._rule.row_states:
            key = "variance" if self._preset == "adafactor" and p.dim() < 2 else \
                self._names.get(name, name)
            # A 0-d param's row state: one row, (1,) here, () in torch's Adafactor.
            out[key] = ({rows, shape} if p.dim() < 2 else {rows}, torch.float32,
                        f"the row state of a parameter of shape {shape} has {rows}", True)
        for name in self._rule.col_states:
            # torch's Adafactor keeps no column state for a param of less than 2 dimensions.
            out[self._names.get(name, name)] = (
                {cols}, torch.float32,
                f"the column state of a parameter of shape {shape} has {cols}",
                not (self._preset == "adafactor" and p.dim() < 2))
        if self._options["master_weights"] and p.dtype != torch.float32:
            out["master"] = ({shape}, torch.float32, f"the parameter has {shape}", False)
        for key in set(out) & (unused | optional):
            out[key] = out[key][:3] + (False,)
        return out

    @staticmethod
    def _loaded_step(i, value, who=None):
        """A saved step count as an int: a whole number, 0 to 2^53, given as an int, a float
        or a tensor of one element (torch's). `who` names it in an error (else: parameter i
        of load_state_dict)."""
        x = value
        if isinstance(x, torch.Tensor) and x.numel() == 1:
            x = x.item()
        if isinstance(x, numbers.Real) and not isinstance(x, bool):
            if isinstance(x, numbers.Integral):
                n = int(x)
            elif math.isfinite(float(x)) and float(x).is_integer():
                n = int(float(x))
            else:
                n = None
            if n is not None and 0 <= n <= _MAX_STEPS:
                return n
        shown = f"a tensor of {value.numel()} elements" if isinstance(value, torch.Tensor) and \
            value.numel() != 1 else repr(value)
        what = f"{who}: its step" if who else f"load_state_dict: the step of parameter {i}"
        raise UsageError(f"{what} is {shown}; a step count is a whole number from 0 to 2^53 (an "
                         "int, a float or a tensor of one element)")

    @staticmethod
    def _loaded_state(i, key, value, p, expected, who=None):
        """One saved state, checked against what the rule keeps for p and copied onto p's
        device in the dtype the kernel keeps it in. `who` names p in an error (else:
        parameter i of load_state_dict)."""
        shapes, dtype, shape_is, _ = expected
        what = f"{who}: state '{key}'" if who else \
            f"load_state_dict: state '{key}' of parameter {i}"
        if shapes == {()} and isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = torch.tensor(float(value), dtype=torch.float64)  # torch 1.x: a number
        if not isinstance(value, torch.Tensor):
            raise UsageError(f"{what} must be a tensor, not {type(value).__name__}")
        if value.layout != torch.strided:
            raise UsageError(f"{what} is a {value.layout} tensor; a state is a dense tensor")
        if not (value.dtype.is_floating_point or value.dtype in _INT_DTYPES):
            raise UsageError(f"{what} has dtype {value.dtype}; a state is real numbers (kept "
                             f"as {dtype or 'the state dtype'})")
        if tuple(value.shape) not in shapes:
            raise UsageError(f"{what} has shape {tuple(value.shape)}, {shape_is}")
        return value.detach().to(device=p.device, dtype=dtype or value.dtype, copy=True)

    def _state_names(self):
        r = self._rule
        return set(r.states) | set(r.scalars) | set(r.row_states) | set(r.col_states)

    # ---- copies and pickles ----------------------------------------------------------------
    def __getstate__(self):
        """torch's Optimizer state plus the rule (by preset name or text); the kernels are
        not copied: the state is taken out of them, and a copy plans again at its first
        step."""
        self._sync_steps()
        d = dict(self.__dict__)
        d["_engines"], d["_pushed"], d["_key"], d["_last"] = [], [], None, None
        d["_installed"] = {}
        for key in ("_edits", "_table"):  # made again by __setstate__
            d.pop(key, None)
        state = collections.defaultdict(dict)
        for p, entry in self.state.items():
            state[p] = {k: v.clone() if isinstance(v, torch.Tensor) else v
                        for k, v in entry.items()}
        d["state"] = state
        return d

    def __setstate__(self, d):
        if isinstance(d["_rule"], tuple):  # as pickled before Rules pickled themselves
            kind, spec = d["_rule"]
            d = dict(d, _rule=_C.Rule.preset(spec) if kind == "preset" else _C.Rule.parse(spec))
        d.setdefault("_installed", {})
        d.setdefault("_state_shapes", {})
        super().__setstate__(d)
        self._edits = _Edits()
        self._table = _StateTable(self._edits, self.state)
        self.state = self._table
        for p in list(self.state):
            entry = self._watched(p)
            self._installed[p] = (entry, dict(entry))

    # ---- introspection --------------------------------------------------------------------
    @property
    def rule(self):
        """The fusedopt.Rule this optimizer runs."""
        return self._rule

    def stats(self):
        """What a step costs (the C++ OptimizerStats, one dict per engine)."""
        return [bound.engine.stats() for bound in self._engines]

    def __repr__(self):
        return f"fusedopt.torch.Optimizer(rule='{self._rule.name}', " \
               f"groups={len(self.param_groups)})"


def from_torch(optimizer, **options):
    """A fusedopt Optimizer equivalent to a live torch.optim optimizer: the same params and
    groups, hypers and state (step included). ``options`` go to Optimizer (state_dtype, ...).
    """
    name = type(optimizer).__name__
    if name not in TORCH_PRESETS:
        raise UsageError(f"torch.optim.{name} has no fusedopt preset (presets exist for: "
                         f"{', '.join(sorted(TORCH_PRESETS))})")
    preset = TORCH_PRESETS[name]
    amsgrad = {bool(g.get("amsgrad", False)) for g in optimizer.param_groups}
    if len(amsgrad) > 1:
        raise UsageError(f"torch.optim.{name}: groups differ in amsgrad; fusedopt runs one rule")
    if amsgrad == {True}:
        preset += "+amsgrad"
    groups = []
    for group in optimizer.param_groups:
        group = {k: v for k, v in group.items() if k != "amsgrad"}
        # torch >= 2.6: Adam(decoupled_weight_decay=True) is AdamW, AdamW says it again.
        decoupled = group.pop("decoupled_weight_decay", None) if preset.startswith("adam") \
            else None
        if decoupled is not None and bool(decoupled) != preset.startswith("adamw"):
            preset = preset.replace("adam", "adamw", 1) if decoupled else \
                preset.replace("adamw", "adam", 1)
        groups.append(group)
    rule_hypers = set(dict(_C.Rule.preset(preset).hypers))
    for g, group in enumerate(groups):
        for key in group:
            if key in _IGNORED or key in rule_hypers or key in _TUPLES:
                continue
            raise UsageError(f"torch.optim.{name}: group {g} has '{key}' = {group[key]!r}, "
                             f"which the preset '{preset}' has no hyper for")
    opt = Optimizer(groups, rule=preset, **options)
    opt.load_state_dict(optimizer.state_dict())
    return opt
