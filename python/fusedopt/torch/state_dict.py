"""``state_dict()`` and ``load_state_dict()`` of a ``fusedopt.torch.Optimizer``
(``StateDictMixin``): torch's layout and state names; a load checked whole before anything
changes."""

import collections.abc
import copy
import numbers
import warnings

import torch

from .. import _fusedopt as _C
from ..errors import UsageError
from .state_table import StateEntry, StateTable

__all__ = ["StateDictMixin"]


def _hooks(optimizer, name):
    """torch >= 2.1's state-dict hooks of `optimizer` (none before)."""
    return list(getattr(optimizer, name, {}).values())


class StateDictMixin:
    """The state dict, with torch's state-dict hooks run where torch runs them."""

    def _sync_steps(self):
        for bound in self._engines:
            taken = bound.engine.step_count()
            for _, _, p in bound.params:
                self._steps[p] = taken

    def state_dict(self):
        """torch's layout: {'state': {index: {name: tensor, 'step': tensor}},
        'param_groups': [...]}, with torch's state names (a quantized state: one record,
        _pack_quantized). torch's state-dict hooks
        (register_state_dict_pre_hook / post_hook) run as torch runs them."""
        for hook in _hooks(self, "_optimizer_state_dict_pre_hooks"):
            hook(self)
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
        faces = self._faces_of_groups()
        for g, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p not in self.state or not self.state[p]:
                    continue
                entry = dict(self.state[p])
                # The count now, as a tensor of its own (opt.state's is live): what
                # opt.state shows, which a user may have set for the next step.
                shown = entry.get("step")
                count = self._step_of(p) if shown is None else \
                    self._loaded_step(mapping[id(p)], shown, "opt.state")
                entry["step"] = torch.tensor(float(count))
                with self._using(faces[g]):
                    state[mapping[id(p)]] = self._pack_quantized(entry)
        state_dict = {"state": state, "param_groups": groups}
        for hook in _hooks(self, "_optimizer_state_dict_post_hooks"):
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def _pack_quantized(self, entry):
        """A quantized state in a state dict: one dict under torch's name, {'storage': 'q8s',
        'block': 256, 'codes': uint8 tensor, 'absmax': float32 tensor}, so that its codes are
        never read as values: load_state_dict checks the record against this optimizer's
        storage, and a torch.optim optimizer given it fails at its first step (a dict has no
        tensor methods) instead of stepping on codes."""
        for key in [k for k in entry if f"{k}.absmax" in entry]:
            rule_name = {self._names.get(n, n): n for n in self._rule.states}.get(key, key)
            entry[key] = {"storage": self._opts.storage.get(rule_name, "-"),
                          "block": self._opts.quant_block(), "codes": entry[key],
                          "absmax": entry.pop(f"{key}.absmax")}
        return entry

    def _unpack_quantized(self, i, key, value, entry, p, expected):
        """State `key` of parameter i as its codes and absmax (opt.state's `key` and
        `key.absmax`), checked by the one check of a loaded state: a quantized record
        (_pack_quantized) against this optimizer's storage, a tensor where this optimizer keeps
        codes refused (values, or codes without their record)."""
        who = f"load_state_dict: state '{key}' of parameter {i}"
        if isinstance(value, collections.abc.Mapping):
            storage, block = value.get("storage"), value.get("block")
            if not isinstance(storage, str) or isinstance(block, bool) or \
                    not isinstance(block, numbers.Integral) or \
                    set(value) != {"storage", "block", "codes", "absmax"}:
                raise UsageError(f"{who} is a dict with keys {sorted(map(str, value))}; a "
                                 "quantized state is {'storage': str, 'block': int, 'codes': "
                                 "tensor, 'absmax': tensor}, as state_dict() writes it")
            codes, absmax = value["codes"], value["absmax"]
        elif f"{key}.absmax" in entry:
            raise UsageError(
                f"{who} is codes with '{key}.absmax' beside them but no record of their "
                "storage (a state dict of fusedopt before 2026-11-28): write them as "
                f"'{key}': {{'storage': KIND, 'block': BLOCK, 'codes': ..., 'absmax': ...}} "
                "with the storage and block they were saved with")
        elif f"{key}.absmax" in expected:
            storage, block, codes, absmax = "-", 0, value, value
        else:
            return {key: self._loaded_state(i, key, value, p, expected[key])}
        self._check_quantized(who, p, key, codes, absmax, storage, int(block))
        if f"{key}.absmax" not in expected:  # a record that says '-': not a quantized state
            raise UsageError(f"{who} is a quantized state's record of storage {storage!r}; "
                             "this optimizer keeps its values")
        return {k: self._loaded_state(i, k, v, p, expected[k])
                for k, v in ((key, codes), (f"{key}.absmax", absmax))}

    def load_state_dict(self, state_dict):
        """Loads torch's layout (from this class or from the torch.optim class of the same
        rule): hypers per group, states by torch's names, the step. All or nothing: the whole
        state dict is checked first (groups, hypers, every state's presence, shape and dtype,
        a quantized state's record, codes and absmax by the C++ check_loaded_state, every
        step), then taken; a refused one raises UsageError (a ValueError) naming the
        group or parameter, the state and the problem, and leaves the optimizer as it was."""
        if isinstance(state_dict, collections.abc.Mapping):
            state_dict = dict(state_dict)  # shallow, as torch: a hook may change it
            for hook in _hooks(self, "_optimizer_load_state_dict_pre_hooks"):
                result = hook(self, state_dict)
                if result is not None:
                    state_dict = result
        try:
            updates, states, steps, notes = self._read_state_dict(state_dict)
        finally:
            self._set_face(self._main_face)  # (read group by group, each in its rule's face)
        for note in notes:  # before anything changes (a warning filter may raise)
            warnings.warn(note, stacklevel=2)
        self._release()
        for ours, update in zip(self.param_groups, updates):
            ours.update(update)
        self._table = StateTable(self._edits)
        self.state = self._table
        self._installed = {}
        self._steps = steps
        for p, state in states.items():
            if p in steps:  # shown as torch shows a loaded one (live from the next step)
                state = dict(state, step=torch.tensor(float(steps[p]), dtype=torch.float64))
            entry = StateEntry(self._edits, state)
            dict.__setitem__(self.state, p, entry)
            self._installed[p] = (entry, dict(entry))
        self._state_shapes = {p: tuple(p.shape) for p, state in states.items() if state}
        self._key = None
        self._edits.changed = False
        for hook in _hooks(self, "_optimizer_load_state_dict_post_hooks"):
            hook(self)

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
        for g, (ours, theirs) in enumerate(zip(groups, saved)):
            for i, p in zip(theirs["params"], ours["params"]):
                # Any key, matched by position as torch matches them: an index, or the
                # parameter's name (torch.distributed.checkpoint's state dicts).
                if isinstance(i, bool) or not isinstance(i, (numbers.Integral, str)):
                    raise UsageError(f"{who}: loaded state dict's group {g} lists parameter "
                                     f"{i!r}; parameters are listed by their index or name")
                if i in by_index:
                    raise UsageError(f"{who}: loaded state dict lists parameter {i} twice "
                                     f"(groups {by_index[i][0]} and {g})")
                by_index[i] = (g, p)
            self._set_face(self._face_of(g))  # this group's rule (load_state_dict resets it)
            update, off = {}, set()
            options = set(self._rule.name.split("+")[1:]) if self._preset else set()
            for key, value in theirs.items():
                if key == "params" or key in self._opts.names:  # the optimizer's own decide
                    continue
                if self._preset and key in _C.Rule.preset_options(self._preset) and \
                        bool(value) != (key in options):
                    notes.append(f"load_state_dict: group {g} has {key}={value}, but this "
                                 f"optimizer runs '{self._rule.name}'; the rule decides (build "
                                 f"it with {key}={not value} to follow the checkpoint)")
                    if key in options:
                        off.add(key)
                    continue
                if key == "decoupled_weight_decay" and self._preset in ("adam", "adamw") and \
                        bool(value) != (self._preset == "adamw"):
                    # torch >= 2.6: Adam(decoupled_weight_decay=True) is AdamW.
                    notes.append(f"load_state_dict: group {g} has {key}={value}, but this "
                                 f"optimizer runs '{self._rule.name}'; the rule decides (use "
                                 f"rule='{'adamw' if value else 'adam'}' to follow the "
                                 "checkpoint)")
                    continue
                update[key] = copy.deepcopy(value)  # torch's copy: a tensor lr not shared
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
            self._set_face(self._face_of(g))
            expected = self._expected_states(p, hypers[g], optional[g])
            state = {}
            for key, value in entry.items():
                if key == "step":
                    steps[p] = self._loaded_step(i, value)
                elif value is None:
                    continue  # torch's SGD keeps momentum_buffer None without momentum
                elif key.endswith(".absmax") and key in expected:
                    continue  # the codes' record holds it (_unpack_quantized)
                elif key in expected:
                    state.update(self._unpack_quantized(i, key, value, entry, p, expected))
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

