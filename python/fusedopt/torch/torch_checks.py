"""torch.optim's own checks of its constructors' hypers, per class, in torch 2.x's order and with
its messages and exception type (ValueError), for the presets that stand for those classes:
``fusedopt.torch.Optimizer(params, rule="sgd", nesterov=True)`` refuses what
``torch.optim.SGD(params, nesterov=True)`` refuses, before it looks at ``params``, as torch
does. A user's rule takes any finite number (the library's check, hypers.py)."""

import math
import numbers

import torch

__all__ = ["check_torch_ranges"]


def _n(v):
    """A hyper as torch compares it: a number, or a TypeError as its comparison raises."""
    if isinstance(v, torch.Tensor):
        return float(v.item())
    if not isinstance(v, numbers.Real):
        raise TypeError(f"'<=' not supported between instances of 'float' and "
                        f"'{type(v).__name__}'")
    return float(v)


def _lr(g):
    lr = g.get("lr")
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    return lr


def _at_least_zero(key, what=None):
    def check(g):
        v = g.get(key)
        if v is not None and not 0.0 <= _n(v):
            raise ValueError(f"Invalid {what or key + ' value'}: {v}")
    return check


def _should_be_at_least_zero(key, what):  # torch >= 2.9's wording (Muon)
    def check(g):
        v = g.get(key)
        if v is not None and not 0.0 <= _n(v):
            raise ValueError(f"{what} should be >= 0 but is: {v}")
    return check


def _lr_check(message="Invalid learning rate: {}"):
    def check(g):
        lr = _lr(g)
        if lr is not None and not 0.0 <= _n(lr):
            raise ValueError(message.format(lr))
    return check


def _eps(g):
    eps = g.get("eps")
    if eps is not None and not isinstance(eps, (tuple, list)) and not 0.0 <= _n(eps):
        raise ValueError(f"Invalid epsilon value: {eps}")


def _betas(g):
    betas = g.get("betas")
    if isinstance(betas, (tuple, list)):
        for i, b in enumerate(betas):
            if not 0.0 <= _n(b) < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")


def _nesterov(g):
    if g.get("nesterov") and (_n(g.get("momentum", 0)) <= 0 or _n(g.get("dampening", 0)) != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


def _rho(g):
    if "rho" in g and not 0.0 <= _n(g["rho"]) <= 1.0:
        raise ValueError(f"Invalid rho value: {g['rho']}")


def _etas(g):
    etas = g.get("etas")
    if isinstance(etas, (tuple, list)) and len(etas) == 2 and \
            not 0.0 < _n(etas[0]) < 1.0 < _n(etas[1]):
        raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")


def _initial_accumulator(g):
    v = g.get("initial_accumulator_value")
    if v is not None and not 0.0 <= _n(v):
        raise ValueError(f"Invalid initial_accumulator_value value: {v}")


def _adafactor(g):
    if "beta2_decay" in g and not 0.0 >= _n(g["beta2_decay"]):
        raise ValueError(f"beta2_decay should be <= 0 but is: {g['beta2_decay']}")
    eps = g.get("eps")
    if isinstance(eps, (tuple, list)) and len(eps) == 2:
        if eps[0] is not None and not 0.0 <= _n(eps[0]):
            raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
        if not 0.0 <= _n(eps[1]):
            raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
    if "d" in g and not 1.0 <= _n(g["d"]):
        raise ValueError(f"Clipping threshold d should be >= 1 but is: {g['d']}")
    if "weight_decay" in g and not 0.0 <= _n(g["weight_decay"]):
        raise ValueError(f"weight_decay should be >= 0 but is: {g['weight_decay']}")


def _adjust_lr_fn(g):
    fn = g.get("adjust_lr_fn")
    if fn is not None and not isinstance(fn, numbers.Real) and \
            fn not in ("original", "match_rms_adamw", "spectral_unclamped"):
        raise ValueError(f"Adjust learning rate function {fn} is not supported (give None, "
                         "'original', 'match_rms_adamw' or 'spectral_unclamped')")


_WD = _at_least_zero("weight_decay")
_ADAM = [_lr_check(), _eps, _betas, _WD]
# Preset base -> its torch class's checks, in the class's order (torch 2.x).
CHECKS = {
    "sgd": [_lr_check(), _at_least_zero("momentum"), _WD, _nesterov],
    "adam": _ADAM,
    "adamw": _ADAM,
    "adamax": _ADAM,
    "radam": _ADAM,
    "nadam": _ADAM + [_at_least_zero("momentum_decay")],
    "adadelta": [_lr_check(), _rho, _eps, _WD],
    "adagrad": [_lr_check(), _at_least_zero("lr_decay"), _WD, _initial_accumulator, _eps],
    "rmsprop": [_lr_check(), _eps, _at_least_zero("momentum"), _WD, _at_least_zero("alpha")],
    "rprop": [_lr_check(), _etas],
    "asgd": [_lr_check(), _at_least_zero("lambd"), _at_least_zero("alpha"), _WD],
    "adafactor": [_lr_check("Learning rate should be >= 0 but is: {}"), _adafactor],
    "muon": [_lr_check("Learning rate should be >= 0 but is: {}"),
             _should_be_at_least_zero("momentum", "momentum"),
             _should_be_at_least_zero("weight_decay", "weight decay"), _adjust_lr_fn],
}
# The presets without a torch class: torch's common checks (lr, eps, each beta, weight_decay).
_COMMON = [_lr_check(), _eps, _betas, _WD, _at_least_zero("momentum")]


def check_torch_ranges(preset, group):
    """Raises torch's ValueError for the first hyper of `group` that preset's torch class
    refuses (a preset without a class: lr, eps, weight_decay and momentum not negative, each
    beta in [0, 1))."""
    # A value that is not a finite number is the library's to refuse (a UsageError, itself a
    # ValueError, naming the hyper and the group: hypers.py), not torch's check's.
    group = {k: v for k, v in group.items() if not _non_finite(v)}
    for check in CHECKS.get(preset, _COMMON):
        check(group)


def _non_finite(value):
    values = value if isinstance(value, (tuple, list)) else (value,)
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, numbers.Real) and not math.isfinite(v):
            return True
    return False
