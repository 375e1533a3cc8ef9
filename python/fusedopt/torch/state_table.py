"""``opt.state`` of ``fusedopt.torch.Optimizer``: torch's table of per-param state dicts, whose
tensors are views of the engines' memory, and which notices when user code edits it.

torch.optim reads ``opt.state`` at every step, so users reset or replace an optimizer's state
by editing it (``opt.state.clear()``, ``opt.state[p] = {}``, ``opt.state[p]['exp_avg'] =
t``). Here the engines hold the state and ``opt.state`` only shows it; an edit marks a flag
that the next step checks (one attribute read: a steady step stays free of per-tensor work)
and then takes into the engines. Writing into the tensors themselves (``.zero_()``,
``.copy_()``) needs nothing: they are the engines' memory.
"""

import collections

__all__ = ["Edits", "StateEntry", "StateTable"]


class Edits:
    """Whether ``opt.state`` was edited since the optimizer last took it in."""

    __slots__ = ("changed",)

    def __init__(self):
        self.changed = False


def _marking(name):
    base = getattr(dict, name)

    def method(self, *args, **kwargs):
        self._edits.changed = True
        return base(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


_MUTATORS = ("__setitem__", "__delitem__", "clear", "popitem", "update") + \
    (("__ior__",) if hasattr(dict, "__ior__") else ())


def _pop(self, key, *default):
    if key in self:
        self._edits.changed = True
    return dict.pop(self, key, *default)


def _setdefault(self, key, default=None):
    if key not in self:
        self._edits.changed = True
    return dict.setdefault(self, key, default)


class StateEntry(dict):
    """One param's state: the engine's views, by torch's names. Copies and pickles of it are
    plain dicts."""

    __slots__ = ("_edits",)

    def __init__(self, edits, items=()):
        dict.__init__(self, items)
        self._edits = edits

    def __reduce__(self):
        return (dict, (dict(self),))


class StateTable(collections.defaultdict):
    """``opt.state``: param -> StateEntry. Reading a param that has no state gives an empty
    dict, as torch's defaultdict does, without counting as an edit. Copies and pickles of it
    are plain defaultdicts."""

    __slots__ = ("_edits",)

    def __init__(self, edits, items=()):
        collections.defaultdict.__init__(self, dict)
        dict.update(self, items)
        self._edits = edits

    def __missing__(self, key):
        value = {}
        dict.__setitem__(self, key, value)
        return value

    def __reduce__(self):
        return (collections.defaultdict, (dict,), None, None, iter(dict(self).items()))

    def copy(self):  # a plain defaultdict (defaultdict's would make a StateTable of it)
        return collections.defaultdict(dict, dict(self))

    __copy__ = copy

    def __or__(self, other):
        out = self.copy()
        out.update(other)
        return out


for _cls in (StateEntry, StateTable):
    for _name in _MUTATORS:
        setattr(_cls, _name, _marking(_name))
    _cls.pop = _pop
    _cls.setdefault = _setdefault
