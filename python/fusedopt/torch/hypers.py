"""Hypers: torch's face of the presets (class names, state names, tuple keys) and the hypers of
each param group as the kernel reads them, checked as torch.optim and the library check
them (``HypersMixin``, a part of ``fusedopt.torch.Optimizer``)."""

import numbers

import torch

from .. import _fusedopt as _C
from ..errors import UsageError

__all__ = ["TORCH_PRESETS", "STATE_NAMES", "TUPLES", "CHOICES", "TORCH_TYPES", "IGNORED",
           "UNUSED_WHEN_ZERO", "HypersMixin", "to_float", "hyper_float"]

# torch.optim class -> preset, with the torch names of the rule's states where they differ.
TORCH_PRESETS = {
    "SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad", "RMSprop": "rmsprop",
    "Adamax": "adamax", "NAdam": "nadam", "RAdam": "radam", "Adadelta": "adadelta",
    "Rprop": "rprop", "ASGD": "asgd", "Adafactor": "adafactor", "Muon": "muon",
}
STATE_NAMES = {  # rule state -> torch state, per preset base
    "adam": {"m": "exp_avg", "v": "exp_avg_sq", "max_v": "max_exp_avg_sq"},
    "adamw": {"m": "exp_avg", "v": "exp_avg_sq", "max_v": "max_exp_avg_sq"},
    "adamax": {"m": "exp_avg"},
    "nadam": {"m": "exp_avg", "v": "exp_avg_sq", "mu_prod": "mu_product"},
    "radam": {"m": "exp_avg", "v": "exp_avg_sq"},
    "adafactor": {"r": "row_var", "c": "col_var"},
    "muon": {"buf": "momentum_buffer"},
}
# torch's tuple-valued hypers and the rule hypers they hold.
TUPLES = {
    "betas": ("beta1", "beta2"),
    "etas": ("etaminus", "etaplus"),
    "step_sizes": ("step_size_min", "step_size_max"),
    "eps": ("eps1", "eps2"),  # Adafactor's (eps1, eps2); a plain eps elsewhere
    "ns_coefficients": ("ns_a", "ns_b", "ns_c"),  # Muon's Newton-Schulz (a, b, c)
}
# torch's hypers that name a choice (a string, or None for the default), per preset base: rule
# hyper -> the number the rule reads for each name. The rule's numbers are taken too; any
# other value is refused (a rule's own hyper of the same name, in a rule of the user's, is a
# plain number).
CHOICES = {
    "muon": {"adjust_lr_fn": {None: 0, "original": 0, "match_rms_adamw": 1,
                              "spectral_unclamped": 2}},
}
# The types torch's class gives a preset's defaults, where a group read back into torch needs
# them (torch.optim.Muon loops range(ns_steps): a float would not do; its adjust_lr_fn is a
# name, None for "original"): preset -> rule hyper -> the rule's default as torch keeps it.
TORCH_TYPES = {
    "muon": {"nesterov": bool, "ns_steps": int,
             "adjust_lr_fn": lambda v: {0: None, 1: "match_rms_adamw",
                                        2: "spectral_unclamped"}[int(v)]},
}
# Group keys torch (or its schedulers) keep that no rule reads.
IGNORED = {"params", "param_names", "foreach", "capturable", "differentiable", "fused",
            "initial_lr", "amsgrad", "name"}
# States torch's class leaves out while a hyper of the param's group is 0 (RMSprop keeps no
# momentum_buffer without momentum, no grad_avg unless centered): torch state -> that hyper.
UNUSED_WHEN_ZERO = {
    "sgd": {"momentum_buffer": "momentum"},
    "rmsprop": {"momentum_buffer": "momentum", "grad_avg": "centered"},
}


def hyper_float(name, value, preset=None, key=None):
    """A hyper's value as the kernel reads it: a choice's name (CHOICES of preset base
    `preset`) as its number, else to_float. `key`: the group key it came from, for the
    message (name when None)."""
    choices = CHOICES.get(preset, {}).get(name)
    if choices is not None and (value is None or isinstance(value, str)):
        if value not in choices:
            names = ", ".join(repr(c) for c in choices)
            raise UsageError(f"hyper '{key or name}' is {value!r}; it is one of {names} (or "
                             f"the rule's number: {sorted(set(choices.values()))})")
        return float(choices[value])
    number = to_float(value, key or name)
    if choices is not None and number not in choices.values():
        names = ", ".join(repr(c) for c in choices)
        raise UsageError(f"hyper '{key or name}' is {value!r}; it is one of {names} (or the "
                         f"rule's number: {sorted(set(choices.values()))})")
    return number


def to_float(value, key, none_is_zero=False):
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


class HypersMixin:
    """The hypers of an Optimizer's groups. Reads ``_rule``, ``_preset``, ``_rule_defaults``,
    ``_hyper_names``, ``_opts`` and ``defaults``."""

    def _defaults(self, hypers):
        rule_defaults = dict(self._rule.hypers)
        defaults = {}
        # Torch's tuple keys where the rule has the whole tuple (the preset's torch face).
        covered, tuples = set(), set()
        for key, names in TUPLES.items():
            if all(n in rule_defaults for n in names) and (key in hypers or self._preset):
                defaults[key] = tuple(rule_defaults[n] for n in names)
                covered.update(names)
                tuples.add(key)
        for name, value in rule_defaults.items():
            if name not in covered:
                defaults[name] = value
        if self._preset == "adafactor" and "eps" in defaults:
            defaults["eps"] = (None, defaults["eps"][1])  # torch's: None for eps1 = 0
        for name, as_torch in TORCH_TYPES.get(self._preset, {}).items():
            if name in defaults:
                defaults[name] = as_torch(defaults[name])
        for key, value in hypers.items():
            if key in IGNORED:
                continue
            if key in tuples:
                if not isinstance(value, (tuple, list)) or len(value) != len(TUPLES[key]):
                    raise UsageError(f"hyper '{key}' must be a tuple of {len(TUPLES[key])} "
                                     f"({', '.join(TUPLES[key])})")
                defaults[key] = tuple(value)
            elif key in defaults:
                defaults[key] = value
            elif key in rule_defaults:  # a rule name for a part of a tuple key
                for tkey, names in TUPLES.items():
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
                out.append(hyper_float(name, group[name], self._preset))
                continue
            for key, names in TUPLES.items():
                if name not in names or key not in group:
                    continue
                value = group[key]
                if isinstance(value, (tuple, list)) and len(value) == len(names):
                    out.append(to_float(value[names.index(name)], key, none_is_zero=key == "eps"))
                    break
                if isinstance(value, (tuple, list)) or isinstance(self.defaults.get(key), tuple):
                    raise UsageError(f"hyper '{key}' is {value!r}; it must be a tuple of "
                                     f"{len(names)} ({', '.join(names)})")
            else:
                out.append(hyper_float(name, self.defaults.get(name, self._rule_defaults[name]),
                                       self._preset))
        return out

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

    def _check_torch_types(self, g, group):
        """A hyper that is not a number is a TypeError at construction, as in torch.optim
        (whose range checks compare it with a number)."""
        for key, value in group.items():
            if key in IGNORED or key in self._opts.names:
                continue
            if key in CHOICES.get(self._preset, {}) and (value is None or isinstance(value, str)):
                continue  # a choice's name: checked as the kernel reads it (hyper_float)
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if v is not None and not isinstance(v, (numbers.Real, torch.Tensor)):
                    raise TypeError(f"param group {g}: hyper '{key}' is {v!r} (a "
                                    f"{type(v).__name__}); a hyper is a number")

    def _check_group_hypers(self, where, g, group):
        """Group g's hypers as the kernel will read them: torch's tuple keys of the right
        length, every hyper a number that passes the library's check_hyper_value."""
        for key, names in TUPLES.items():
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
