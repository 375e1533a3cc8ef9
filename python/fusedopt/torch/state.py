"""The state of a ``fusedopt.torch.Optimizer`` as torch keeps it (``StateMixin``): what each
param's states are (torch's names, shapes, dtypes), a loaded or edited state checked against
that, and edits of ``opt.state`` taken into the engines."""

import math
import numbers

import torch

from .. import _dtypes
from .. import _fusedopt as _C
from ..errors import UsageError
from .distributed import is_dtensor, local
from .hypers import UNUSED_WHEN_ZERO
from .state_table import StateEntry, StateTable

__all__ = ["StateMixin", "MAX_STEPS"]

MAX_STEPS = 2**53  # the C++ Optimizer's bound on a step count
_TORCH_DTYPES = {code: dtype for dtype, code in _dtypes.torch_dtypes().items()}
_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_INT_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
# A dtype's safetensors name, as the C++ check of a loaded state (check_loaded_state) reads it.
_SAFETENSORS = {torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
                torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.float32: "F32", torch.float64: "F64", torch.bool: "BOOL"}


class StateMixin:
    """Reads ``_rule``, ``_preset``, ``_names`` (rule state -> torch name), ``_opts``."""

    def _adopt_state(self):
        """Takes edits of opt.state made since the engines' views were put there, as torch
        reads its state at every step: a param whose entry is gone or holds none of its
        states starts again (step 0, every state from its initial value); a state given a new
        tensor goes on from its values (checked as load_state_dict checks one; a 'step' sets
        the step count); a state deleted from an entry starts from its initial value. The
        engines are built again at this step. All or nothing: a refused edit changes
        nothing."""
        if self.state is not self._table:  # the whole table replaced
            self._table = StateTable(self._edits, self.state)
            self.state = self._table
        where = {p: (g, i) for g, group in enumerate(self.param_groups)
                 for i, p in enumerate(group["params"])}
        taken = {}  # param -> (step or None, checked new tensors), or None: start again
        for p, (entry, views) in list(self._installed.items()):
            now = dict.get(self.state, p)
            if p not in where:
                continue  # no longer in a group: no step reads it
            # The live 'step' the engine put there is no edit unless written into (host);
            # another one sets the count.
            live = views.get("step")
            counter = self._counters.get(p)
            step_written = live is not None and now is not None and \
                now.get("step") is live and counter is not None and \
                live.device.type == "cpu" and float(live) != float(counter)
            if now is not None and ("step" not in now or "step" in views) and \
                    not step_written and all(now.get(key) is view for key, view in views.items()):
                if now is not entry:  # the same views in a new dict: watched from now on
                    entry = StateEntry(self._edits, now)
                    dict.__setitem__(self.state, p, entry)
                    self._installed[p] = (entry, views)
                continue  # untouched (or only keys no rule reads changed)
            if now is None or ("step" not in now and
                               not any(key in now for key in views if key != "step")):
                taken[p] = None
                continue
            g, i = where[p]
            with self._using(self._face_of(g)):
                who = f"opt.state of {self._who(g, i)}"
                hypers = dict(zip(self._hyper_names,
                                  self._group_hypers(self.param_groups[g])))
                expected = self._expected_states(p, hypers, set())
                step, new = None, {}
                for key in expected:  # a quantized state's codes and absmax, checked together
                    codes, absmax = now.get(key), now.get(f"{key}.absmax")
                    if f"{key}.absmax" in expected and codes is not None and \
                            absmax is not None and (codes is not views.get(key) or
                                                    absmax is not views.get(f"{key}.absmax")):
                        self._check_quantized(f"{who}: state '{key}'", p, key, codes, absmax)
                for key, value in now.items():
                    if key == "step":
                        if value is not views.get("step") or step_written:
                            step = self._loaded_step(i, value, who)
                    elif key in expected and value is not None and \
                            value is not views.get(key):
                        new[key] = self._loaded_state(i, key, value, p, expected[key], who)
                taken[p] = (step, new)
        self._edits.changed = False  # taken (a refused edit is seen again at the next step)
        if not taken:
            return
        self._release()  # the engines' states copied into opt.state, then the edits on top
        for p, change in taken.items():
            if change is None:
                entry = StateEntry(self._edits)
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

    def _expected_states(self, p, hypers, optional):
        """The states of param p (torch's names) as _views will hold them: key -> (shapes
        accepted, dtype kept, what the shape is, required). A DTensor param's are its local
        shard's; a complex param's element states are complex, as torch keeps them."""
        p = local(p)
        shape = tuple(p.shape)
        flat = list(shape) or [1]
        rows = tuple(flat[:-1] + [1]) if len(flat) >= 2 else tuple(flat)
        cols = tuple(flat[:-2] + [1, flat[-1]]) if len(flat) >= 2 else (1,)
        unused = {key for key, hyper in UNUSED_WHEN_ZERO.get(self._preset, {}).items()
                  if hypers.get(hyper, 1.0) == 0.0}
        out = {}
        state_dtype = _TORCH_DTYPES.get(self._opts.state_dtype)
        block = self._opts.quant_block()
        n = p.numel() * (2 if p.is_complex() else 1)
        # A float64 param keeps its states in float64 (as torch does), whatever state_dtype.
        element_dtype = torch.float64 if p.dtype in (torch.float64, torch.complex128) else \
            state_dtype
        # A complex param's element states: complex where the dtype has a complex form,
        # else (16-bit, quantized) its real pairs, as the engine keeps them.
        eshape = shape
        if p.is_complex():
            element_dtype = _COMPLEX.get(element_dtype, element_dtype)
            eshape = shape if element_dtype.is_complex else shape + (2,)
        for name in self._rule.states:
            key = self._names.get(name, name)
            kind = self._opts.storage.get(name, "-")
            if kind != "-" and 0 < n and n >= self._opts.quant_min_numel:
                codes = {shape + (2,) if p.is_complex() else shape} if kind.startswith("q8") \
                    else {((n + 1) // 2,)}
                out[key] = (codes, torch.uint8, f"its codes have {min(codes)}", True)
                out[key + ".absmax"] = ({((n + block - 1) // block,)}, torch.float32,
                                        f"one absmax per {block} elements", True)
                continue
            out[key] = ({eshape}, element_dtype, f"the parameter has {shape}", True)
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
        if self._opts.master_weights and p.dtype in (torch.float16, torch.bfloat16):
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
        if isinstance(x, torch.Tensor) and x.device.type == "meta":
            x = None  # no value to read (item() would raise torch's NotImplementedError)
        elif isinstance(x, torch.Tensor) and x.numel() == 1:
            x = x.item()
        if isinstance(x, numbers.Real) and not isinstance(x, bool):
            if isinstance(x, numbers.Integral):
                n = int(x)
            elif math.isfinite(float(x)) and float(x).is_integer():
                n = int(float(x))
            else:
                n = None
            if n is not None and 0 <= n <= MAX_STEPS:
                return n
        shown = f"a tensor of {value.numel()} elements" if isinstance(value, torch.Tensor) and \
            value.numel() != 1 else repr(value)
        if isinstance(value, torch.Tensor) and value.device.type == "meta":
            shown = "a tensor on the meta device, which holds no value"
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
        whole = value if is_dtensor(value) else None
        if whole is not None:  # a DTensor param's state (ours, DCP's): this rank's shard
            value = value.to_local()
        if shapes == {()} and isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = torch.tensor(float(value), dtype=torch.float64)  # torch 1.x: a number
        if not isinstance(value, torch.Tensor):
            raise UsageError(f"{what} must be a tensor, not {type(value).__name__}")
        if value.layout != torch.strided:
            raise UsageError(f"{what} is a {value.layout} tensor; a state is a dense tensor")
        if value.device.type == "meta":  # no values to copy: torch's NotImplementedError
            raise UsageError(f"{what} is a tensor on the meta device, which holds no values; a "
                             "state is a tensor of values (on any other device)")
        if value.is_complex() and p.is_complex() and not (dtype is not None and dtype.is_complex):
            value = torch.view_as_real(value)  # kept as real pairs (16-bit states)
        if value.is_complex() and p.is_complex():
            pass  # a complex param's state (torch's layout)
        elif not (value.dtype.is_floating_point or value.dtype in _INT_DTYPES):
            raise UsageError(f"{what} has dtype {value.dtype}; a state is real numbers (kept "
                             f"as {dtype or 'the state dtype'})")
        if tuple(value.shape) not in shapes:
            raise UsageError(f"{what} has shape {tuple(value.shape)}, {shape_is}")
        out = value.detach().to(device=p.device, dtype=dtype or value.dtype, copy=True)
        if whole is not None:  # kept a DTensor as it came, so state_dict() gives it back
            out = type(whole).from_local(out, whole.device_mesh, whole.placements,
                                         run_check=False, shape=whole.shape,
                                         stride=whole.stride())
        return out

    def _check_quantized(self, what, p, key, codes, absmax, saved="", block=0):
        """The one check of a quantized state before it is loaded (the C++ library's
        check_loaded_state, which Optimizer::load runs too): state `key` (torch's name) of
        param p as `codes` and `absmax`, saved as storage `saved` in blocks of `block` ('' and
        0: not recorded, an edit of opt.state). Its storage, block, code dtype and count,
        absmax dtype, count and values (finite, >= 0; a block of absmax 0 holds the codes of
        0); UsageError starting with `what`. What is not a dense tensor with data is left to
        _loaded_state, which refuses it."""
        rule_name = {self._names.get(n, n): n for n in self._rule.states}.get(key, key)
        lp = local(p)
        n = lp.numel() * (2 if lp.is_complex() else 1)
        kind = self._opts.storage.get(rule_name, "-")
        if kind == "-" or not 0 < n or n < self._opts.quant_min_numel:
            kind = "-"
        tensors = []
        for t in (codes, absmax):
            if is_dtensor(t):
                t = t.to_local()
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_meta:
                return
            name = _SAFETENSORS.get(t.dtype, str(t.dtype).replace("torch.", ""))
            data = t.detach().to("cpu").contiguous().reshape(-1) if name in ("U8", "F32") \
                else torch.empty(0, dtype=torch.uint8)
            tensors += [name, t.numel(), data]
        _C.check_loaded_state(what, kind, self._opts.quant_block(), n, saved, block, *tensors)

    def _state_names(self):
        r = self._rule
        return set(r.states) | set(r.scalars) | set(r.row_states) | set(r.col_states)

