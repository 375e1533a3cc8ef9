"""Param groups of their own rule (``FacesMixin``): an optimizer built with rule="muon" may take
a group {"params": ..., "rule": "adamw", ...}. Each rule is a ``Face``: the rule and what its
groups read of it (its preset, torch's state names, its hypers and defaults, the options as the
library checks them for it). The mixins read the face of the group at hand as the optimizer's
own attributes (``_rule``, ``_preset``, ``_names``, ``_rule_defaults``, ``_hyper_names``,
``_opts``, ``defaults``): ``with self._using(face)`` sets them for a piece of work. Engines are
planned per face (engines.py), so each rule steps in launches of its own."""

import contextlib

from .. import _fusedopt as _C
from .. import rule as _rule
from ..errors import UsageError
from .hypers import STATE_NAMES
from .options import Options

__all__ = ["Face", "FacesMixin", "FACE_ATTRIBUTES"]

# Optimizer attribute -> Face field.
FACE_ATTRIBUTES = {"_rule": "rule", "_preset": "preset", "_names": "names",
                   "_rule_defaults": "rule_defaults", "_hyper_names": "hyper_names",
                   "_opts": "opts", "defaults": "defaults"}


class Face:
    """One rule of an optimizer: `spec` as given (a preset name, a rule's text or a Rule)."""

    def __init__(self, spec, rule, preset):
        self.spec = spec
        self.rule = rule
        self.preset = preset
        self.names = dict(STATE_NAMES.get(preset, {}))
        self.rule_defaults = dict(rule.hypers)
        self.hyper_names = list(self.rule_defaults)
        self.opts = None
        self.defaults = {}

    def default_hypers(self):
        """The rule's own defaults as the kernel reads them (a group of another rule's)."""
        return [float(v) for v in self.rule_defaults.values()]


def preset_of(rule, hypers):
    """(rule spec with the preset options that `hypers` pick, preset base or None); the
    options are taken out of `hypers`."""
    if isinstance(rule, str) and rule.split("+")[0] in _C.Rule.presets():
        # A preset: its options (amsgrad=True) may come as keyword hypers, as in torch.
        parts = rule.split("+")
        base, chosen = parts[0], set(parts[1:])
        for option in _C.Rule.preset_options(base):
            if option in hypers:
                (chosen.add if bool(hypers.pop(option)) else chosen.discard)(option)
        return "+".join([base] + sorted(chosen)), base
    return rule, None


class FacesMixin:
    """Owns ``_faces`` (spec key -> Face; the optimizer's own first), ``_main_face`` and
    ``_face`` (the one whose attributes are set)."""

    def _set_face(self, face):
        for attribute, field in FACE_ATTRIBUTES.items():
            setattr(self, attribute, getattr(face, field))
        self._face = face

    @contextlib.contextmanager
    def _using(self, face):
        before = self._face
        if face is before:
            yield face
            return
        self._set_face(face)
        try:
            yield face
        finally:
            self._set_face(before)

    @staticmethod
    def _spec_key(spec):
        if isinstance(spec, str):
            return spec
        if isinstance(spec, _C.Rule):
            return ("rule", spec.name, spec.text)
        raise UsageError(f"a param group's 'rule' is {spec!r} (a {type(spec).__name__}); give a "
                         "preset's name, a rule's text or a fusedopt.Rule")

    def _face_key(self, group):
        """The key of the face a group steps with: its 'rule', else the optimizer's."""
        spec = group.get("rule")
        return self._main_key if spec is None else self._spec_key(spec)

    def _face_of(self, g):
        """The face of param group g."""
        group = self.param_groups[g]
        face = self._faces.get(self._face_key(group))
        if face is None:
            raise UsageError(f"param group {g} has rule {group.get('rule')!r}, which it was "
                             "not added with; a group's rule is chosen when the group is "
                             "added (add_param_group)")
        return face

    def _faces_of_groups(self):
        return [self._face_of(g) for g in range(len(self.param_groups))]

    def _new_face(self, spec, name, hypers, given, where):
        """The face of rule `spec` (hypers: the constructor's keyword hypers for the
        optimizer's own rule, {} for a group's), its attributes set."""
        spec_picked, preset = preset_of(spec, hypers)
        face = Face(spec, _rule(spec_picked, name), preset)
        self._set_face(face)
        self._check_rule_options(where, hypers)
        face.opts = self._opts = Options(face.rule, dict(given, rule=spec), hypers)
        defaults = self._defaults(hypers)
        if preset is not None:
            for option in _C.Rule.preset_options(preset):  # torch's group keys
                defaults[option] = option in face.rule.name.split("+")[1:]
        face.defaults = self.defaults = defaults
        return face

    def _face_for_group(self, g, param_group):
        """The face a group being added steps with: the optimizer's, or (its 'rule' another)
        a face of its own, made the first time the rule is named."""
        key = self._face_key(param_group)
        face = self._faces.get(key)
        if face is not None:
            return face
        main = self._main_face
        given = dict(main.opts.given)
        if float(given.get("max_grad_norm", 0.0) or 0.0) != 0.0:
            raise UsageError(f"param group {g} has rule {param_group['rule']!r} of its own, but "
                             "the optimizer clips by the global norm (max_grad_norm), which "
                             "spans every rule's params: clip before step() instead "
                             "(torch.nn.utils.clip_grad_norm_)")
        if self._process_group is not None:
            raise UsageError(f"param group {g} has rule {param_group['rule']!r} of its own; "
                             "param groups of their own rule do not work with a "
                             "process_group (sharded optimizers) yet")
        given.setdefault("max_grad_norm", 0.0)
        try:
            face = self._new_face(param_group["rule"], None, {}, given,
                                  f"add_param_group: param group {g}")
        finally:
            self._set_face(main)
        self._faces[key] = face
        return face
