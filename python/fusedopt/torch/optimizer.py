"""``fusedopt.torch.Optimizer``, a ``torch.optim.Optimizer`` over any rule, and ``from_torch``.
The jobs are parts of their own files: options (options.py), hypers (hypers.py), engines
(engines.py), state (state.py), state_dict (state_dict.py), sharded params
(distributed.py)."""

import collections
import re

import torch

from .. import _fusedopt as _C
from ..errors import UsageError
from . import distributed
from .engines import GRAD, EnginesMixin, bindable
from .hypers import IGNORED, TORCH_PRESETS, TUPLES, HypersMixin
from .options import OPTIONS, Options, signature
from .state import StateMixin
from .state_dict import StateDictMixin
from .faces import Face, FacesMixin
from .state_table import Edits, StateTable
from .torch_checks import check_torch_ranges

__all__ = ["Optimizer", "from_torch"]

_MATRIX_STAGE = re.compile(r"\borthogonalize\s*\(")  # a rule with a matrix stage


class Optimizer(FacesMixin, HypersMixin, EnginesMixin, StateMixin, StateDictMixin, torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` running ``rule`` as one fused kernel per step.

    ``rule``: a preset name ('adamw', 'sgd', 'adamw+amsgrad', ...), a rule's text, or a
    ``fusedopt.Rule``; ``name`` names a rule given as text (its fusion report, errors as
    NAME.rule:LINE:COL and the kernel cache's list show it; else ``<rule>``). Keyword hypers use the rule's names or torch's (``betas=(0.9, 0.999)``
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
    the element: the same bits on any thread count or layout. ``matrix_precision`` ('fp32' or
    'bf16') is the precision of a rule's matrix stages (the Newton-Schulz iteration of
    ``muon``): 'bf16' rounds as torch.optim.Muon does.
    """

    _step_supports_amp_scaling = True

    def __init__(self, params, rule="adamw", name=None, **kwargs):
        given = {name: kwargs.pop(name, default) for name, default in OPTIONS.items()}
        hypers = kwargs
        given["rule"] = rule
        if given["process_group"] is None:
            given["process_group"] = distributed.zero_process_group()
        elif not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise UsageError("process_group is given, but torch.distributed is not initialized "
                             "(call torch.distributed.init_process_group first)")
        self._process_group = given["process_group"]
        # The optimizer's own rule; a param group may name another (faces.py).
        face = self._new_face(rule, name, hypers, given, "Optimizer")
        self._main_face = face
        self._main_key = self._spec_key(rule)
        self._faces = {self._main_key: face}
        preset_base, defaults = face.preset, face.defaults
        if preset_base is not None:  # torch's checks come before its look at params
            self._check_torch_types(0, defaults)
            check_torch_ranges(preset_base, defaults)
        self._engines = []
        self._counters = {}  # param -> its engine's step count (a view), for edits of 'step'
        self._shards = None  # how DTensor params lie on their mesh (distributed.Shards)
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
        self._edits = Edits()  # opt.state noticing edits (see state_table.py)
        self._table = StateTable(self._edits, self.state)
        self.state = self._table

    def add_param_group(self, param_group):
        """A group of the optimizer's rule, or (its key 'rule' naming another: a preset's
        name, a rule's text or a fusedopt.Rule) of its own rule: its defaults are that
        rule's (the constructor's keyword hypers are the optimizer's rule's), and its params
        step in launches of their own."""
        if not isinstance(param_group, dict):  # torch's TypeError
            return self._add_param_group(param_group)
        with self._using(self._face_for_group(len(self.param_groups), param_group)):
            self._add_param_group(param_group)

    def _add_param_group(self, param_group):
        # The library's rule for a hyper's value, checked here too so that construction
        # refuses what the first step would (as torch refuses a NaN lr); before the group is
        # added, so a refused group changes nothing.
        group = {**self.defaults, **param_group}
        self._check_rule_options(f"add_param_group: param group {len(self.param_groups)}", group)
        self._opts.check_group("add_param_group", len(self.param_groups), group)
        self._check_torch_types(len(self.param_groups), group)
        self._check_group_hypers("Optimizer", len(self.param_groups), group)
        if self._preset is not None:
            check_torch_ranges(self._preset, group)
        if _MATRIX_STAGE.search(self._rule.text):
            params = param_group.get("params")
            params = [params] if isinstance(params, torch.Tensor) else list(params or [])
            for i, p in enumerate(params):
                if isinstance(p, torch.Tensor) and p.dim() < 2:
                    raise UsageError(
                        f"{self._who(len(self.param_groups), i, p)}: rule '{self._rule.name}' "
                        f"orthogonalizes matrices and this param has {p.dim()} dimension"
                        f"{'' if p.dim() == 1 else 's'}; it needs 2 or more (give 1-D params, "
                        "embeddings and heads another rule, e.g. adamw, in a param group "
                        "of their own: {'params': ..., 'rule': 'adamw'})")
        for key in param_group:
            if key in IGNORED or key in self._opts.names or key in self.defaults or \
                    key in self._hyper_names:
                continue
            raise UsageError(f"param group {len(self.param_groups)}: rule "
                             f"'{self._rule.name}' has no hyper '{key}' (it has: "
                             f"{', '.join(self._hyper_names) or 'none'})")
        super().add_param_group(param_group)
        self._key = None  # the next step plans again

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
        # Every group's hypers as the kernel reads them, checked before anything changes.
        faces = self._faces_of_groups() if len(self._faces) > 1 else \
            [self._main_face] * len(self.param_groups)
        hypers = []
        for g, group in enumerate(self.param_groups):
            with self._using(faces[g]):
                self._opts.check_group("step", g, group)
                try:
                    hypers.append(self._group_hypers(group))
                except UsageError as e:  # say which group
                    raise UsageError(f"step: param group {g}: {e}") from None
        if self._edits.changed or self.state is not self._table or \
                self._steps_edited_in_place():
            self._adopt_state()
        if self._unmoved():  # the steady state: one pass, nothing to re-point
            stream = self._stream(self._engines[0].device)
        else:
            flat = [p for group in self.param_groups for p in group["params"]]
            grads = list(map(GRAD, flat))
            with_grad = [p for p, g in zip(flat, grads) if g is not None]
            if not with_grad:
                return loss
            stream = self._stream(with_grad[0].device)
            self._follow(with_grad, stream)
            self._remember(flat, grads)
        for e, bound in enumerate(self._engines):
            for g, values in enumerate(hypers):
                if faces[g] is not bound.face:
                    continue  # a group of another rule: no params in this engine
                if values != self._pushed[e][g]:
                    for name, new, old in zip(bound.face.hyper_names, values,
                                              self._pushed[e][g]):
                        if new != old:
                            bound.engine.set_hyper(name, new, g,
                                                   stream if bound.engine.device >= 0 else None)
                    self._pushed[e][g] = values
            for p, pc, gc in bound.copies:  # what it cannot walk in place, as copies
                if pc is not None:
                    pc.copy_(bindable(p))
                if gc is not None:
                    gc.copy_(bindable(p.grad))
            if grad_scale is None and found_inf is None:
                bound.engine.step(stream)
            else:
                bound.engine.step_amp(grad_scale, found_inf, stream)
            for p, pc, _ in bound.copies:
                if pc is not None:
                    bindable(p).copy_(pc)
            bound.shown.copy_(bound.counter.expand(bound.shown.shape))  # state[p]['step']
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

    def __getstate__(self):
        """torch's Optimizer state plus the rule (by preset name or text); the kernels are
        not copied: the state is taken out of them, and a copy plans again at its first
        step."""
        self._sync_steps()
        d = dict(self.__dict__)
        d["_engines"], d["_pushed"], d["_key"], d["_last"] = [], [], None, None
        d["_shards"] = None  # planned again (a mesh does not pickle)
        d["_counters"] = {}
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
        if "_opts" not in d:  # pickled before the options were one struct
            given = {**OPTIONS, **d.pop("_given")}
            d["_opts"] = Options(d["_rule"], given, {})
            for key in ("_options", "_option_names", "_storage"):
                d.pop(key, None)
        if "_faces" not in d:  # pickled before param groups could name their own rule
            face = Face(d["_opts"].given.get("rule", d["_rule"].name), d["_rule"],
                        d["_preset"])
            face.names, face.opts, face.defaults = d["_names"], d["_opts"], d["defaults"]
            d.update(_main_face=face, _face=face, _main_key=FacesMixin._spec_key(face.spec),
                     _faces={FacesMixin._spec_key(face.spec): face})
        d.setdefault("_installed", {})
        d.setdefault("_shards", None)
        d.setdefault("_counters", {})
        d.setdefault("_state_shapes", {})
        super().__setstate__(d)
        self._edits = Edits()
        self._table = StateTable(self._edits, self.state)
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




Optimizer.__init__.__signature__ = signature()  # help() shows every option (options.py)

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
            if key in IGNORED or key in rule_hypers or key in TUPLES:
                continue
            raise UsageError(f"torch.optim.{name}: group {g} has '{key}' = {group[key]!r}, "
                             f"which the preset '{preset}' has no hyper for")
    opt = Optimizer(groups, rule=preset, **options)
    opt.load_state_dict(optimizer.state_dict())
    return opt
