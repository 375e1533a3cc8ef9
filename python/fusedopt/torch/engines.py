"""The engines of a ``fusedopt.torch.Optimizer`` (``EnginesMixin``): each a C++ optimizer over
the params that step together, planned from the params with grads, their views in
``opt.state``, and the pointer following that keeps them on the tensors torch moves."""

import operator
import weakref

import torch

from .. import _dtypes
from .. import _fusedopt as _C
from ..errors import UsageError
from . import distributed
from .distributed import local, local_ptr
from .state_table import StateEntry

__all__ = ["EnginesMixin", "none_ref", "dtype_code"]

GRAD = operator.attrgetter("grad")


def none_ref():  # the last step's "weak reference" to a grad that was None
    return None


_DTYPES = _dtypes.torch_dtypes()


def dtype_code(dtype, who):
    if dtype not in _DTYPES:
        raise UsageError(f"{who} has dtype {dtype}; fusedopt binds {_dtypes.bound_names()}")
    return _DTYPES[dtype]


def bindable(t):
    """What an engine binds of a param or grad: a DTensor's local shard, a complex tensor as
    torch.optim steps it (torch.view_as_real: its real and imaginary parts, each an element)."""
    t = local(t)
    return torch.view_as_real(t) if t.is_complex() else t


def complex_as_real(t):
    """A state value for a complex param as the engine keeps it (real pairs)."""
    t = local(t)
    return torch.view_as_real(t) if t.is_complex() else t


class _Bound:
    """One C++ optimizer (engine) over a set of params that share a step count, and what
    it was last pointed at (so that a step finds moved tensors cheaply). ``copies``: the
    params and grads it cannot walk in place (not contiguous), [(k, param copy or None, grad
    copy or None)]: the engine binds contiguous copies, filled before each step, the param's
    written back after it (two more passes over such a param per step, one over such a grad)."""

    def __init__(self, engine, params, grads, slots, copies=()):
        self.copies = [(params[k][2], pc, gc) for k, pc, gc in copies]
        self.copies_of = {k: (pc, gc) for k, pc, gc in copies}
        self.engine = engine
        self.params = params  # [(group index, index in group, param)]
        self.tensors = [p for _, _, p in params]
        self.device = self.tensors[0].device
        self.dtypes = [p.dtype for p in self.tensors]
        self.shapes = [p.shape for p in self.tensors]
        # The grads it was pointed at, held weakly: zero_grad(set_to_none=True) must free
        # them before the next backward, as it does without fusedopt.
        self.grads = [weakref.ref(g) for g in grads]
        self.pptrs = [local_ptr(p) for p in self.tensors]
        self.gptrs = [local_ptr(g) for g in grads]
        self.slots = slots  # index in the engine of each param



class EnginesMixin:
    """Planning and following. Owns ``_engines`` (one _Bound each), ``_key`` (the params with
    grads they were planned for), ``_last`` (every param, grad and address as the last step
    left them), ``_steps`` (counts of params outside an engine), ``_pushed``, ``_installed``
    and ``_state_shapes`` (what _build put in opt.state)."""

    def _who(self, g, i, p=None):
        return f"param_groups[{g}]['params'][{i}]" + (f" (shape {tuple(p.shape)})" if p is not None
                                                     else "")

    def _check(self, g, i, p, grad, device):
        who = self._who(g, i, p)
        p, grad = local(p), local(grad)  # a DTensor's shard (distributed.plan_shards checked it)
        if grad.is_sparse:
            raise UsageError(f"{who}: its gradient is sparse; fusedopt takes dense gradients "
                             "(torch.optim.SparseAdam handles sparse ones)")
        if p.is_complex() != grad.is_complex():
            raise UsageError(f"{who}: it is {p.dtype} and its gradient {grad.dtype}")
        dtype_code(bindable(p).dtype, who)
        dtype_code(bindable(grad).dtype, f"{who}.grad")
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
        self._counters = {}  # (their views would keep the engines' memory alive)
        self._key = None

    def _watched(self, p):
        """p's entry in opt.state as a StateEntry (edits of it noticed), put there if it was
        another dict or none."""
        entry = dict.get(self.state, p)
        if not isinstance(entry, StateEntry):
            entry = StateEntry(self._edits, entry or {})
            dict.__setitem__(self.state, p, entry)
        return entry

    def _plan(self, active):
        for g, i, p in active:  # before anything changes: a refusal leaves the engines
            made = self._state_shapes.get(p)
            if made is not None and made != tuple(p.shape) and any(
                    isinstance(v, torch.Tensor) and k != "step"
                    for k, v in dict.get(self.state, p, {}).items()):
                raise UsageError(f"{self._who(g, i)}: its shape changed from {made} to "
                                 f"{tuple(p.shape)} since its state was made; start its state "
                                 "again (opt.state[p] = {}) or load a state of the new shape")
        shards = distributed.plan_shards(active, self._who)
        if shards is not None and self._process_group is not None and \
                self._process_group is not shards.group:
            raise UsageError("process_group is given, but the params are DTensors whose "
                             "reductions span their mesh's shard group: give no process_group")
        self._release()
        self._shards = shards
        device = active[0][2].device
        for g, i, p in active:
            self._check(g, i, p, p.grad, device)
        for g, i, p in active:  # a count set in opt.state[p]['step'] (a param joining others)
            entry = dict.get(self.state, p)
            if entry and "step" in entry:
                self._steps[p] = self._loaded_step(i, entry["step"],
                                                   f"opt.state of {self._who(g, i)}")
                dict.pop(entry, "step")
        # One engine per rule (param groups may name their own: faces.py) and step count
        # (params that skipped steps have their own), in order.
        faces = self._faces_of_groups()
        by_face = {}
        for g, i, p in active:
            by_face.setdefault(id(faces[g]), (faces[g], {}))[1].setdefault(
                self._step_of(p), []).append((g, i, p))
        for face, by_step in by_face.values():
            if len(by_step) > 1 and (face.rule.reduction_passes > 0
                                     or face.opts.max_grad_norm > 0):
                counts = ", ".join(str(s) for s in sorted(by_step))
                raise UsageError(f"rule '{face.rule.name}' reduces over every tensor of a "
                                 f"step, but the parameters with gradients have taken "
                                 f"different numbers of steps ({counts}); step them together: "
                                 "give every parameter a gradient at every step (zeros for a "
                                 "frozen one), or give one that joins later the others' count "
                                 "before its first step (opt.state[p]['step'] = N)")
        for face, by_step in by_face.values():
            with self._using(face):
                for steps, members in by_step.items():
                    self._engines.append(self._build(members, steps, faces))
        self._key = [p for _, _, p in active]  # compared by identity
        self._edits.changed = False  # the writes above were ours

    def _build(self, members, steps, faces):
        """An engine of the rule of face self._face (set) over `members`; `faces`: each
        group's face (a group of another rule is a group without params in this engine, at
        its rule's defaults)."""
        face = self._face
        specs = []
        for g, group in enumerate(self.param_groups):
            spec = _C._GroupSpec()
            values = self._group_hypers(group) if faces[g] is face else face.default_hypers()
            spec.hypers = list(zip(self._hyper_names, values))
            specs.append(spec)
        params, grads, slots, copies, bound = [], [], [], {}, {}
        lists = [([], [], [], []) for _ in self.param_groups]
        for g, i, p in members:
            # A tensor the kernel cannot walk in place is bound as a contiguous copy.
            lp, lg = bindable(p).detach(), bindable(p.grad).detach()
            pc = None if lp.is_contiguous() else lp.contiguous()
            gc = None if lg.is_contiguous() else lg.contiguous()
            if pc is not None or gc is not None:
                copies[(g, i)] = (pc, gc)
            bound[(g, i)] = lp if pc is None else pc
            lists[g][0].append(bound[(g, i)])
            lists[g][1].append(lg if gc is None else gc)
            lists[g][2].append(f"group{g}.param{i}")
            if self._shards is not None:  # the piece of the whole param this rank holds
                whole, offset = self._shards.piece(p)
                lists[g][3].append((list(whole) + ([2] if p.is_complex() else []), offset))
        for g, spec in enumerate(specs):
            spec.params, spec.grads, spec.names, spec.wholes = lists[g]
        # The engine's param order: by group, then as listed.
        ordered = sorted(members, key=lambda m: (m[0], m[1]))
        engine = _C._Engine(self._rule, specs, self._opts.cpp)
        group = self._reduction_group()
        if group is not None and torch.distributed.get_world_size(group) > 1:
            engine.set_reduction_hook(distributed.reduction_hook(self))
        self.engine_builds += 1
        # state[p]['step']: each param's own 0-d tensor, all of one engine in one buffer that
        # the step sets from the count the kernel writes (one copy per engine and step).
        counter = engine.step_view()
        shown = torch.full((len(ordered),), float(steps), dtype=torch.float64,
                           device=counter.device)
        for slot, (g, i, p) in enumerate(ordered):
            params.append((g, i, p))
            grads.append(p.grad)
            slots.append(slot)
            old = dict.get(self.state, p) or {}
            views = self._views(engine, slot, bound[(g, i)])
            for key, (view, _) in views.items():
                if key in old and isinstance(old[key], torch.Tensor):
                    view.copy_(complex_as_real(old[key]).reshape(view.shape))
            fresh = {key: self._shown(view, kind, p) for key, (view, kind) in views.items()}
            fresh["step"] = shown[slot]
            entry = dict.get(self.state, p)
            if isinstance(entry, StateEntry):  # the same dict, as torch keeps it
                dict.clear(entry)
                dict.update(entry, fresh)
            else:
                entry = StateEntry(self._edits, fresh)
                dict.__setitem__(self.state, p, entry)
            self._installed[p] = (entry, fresh)
            self._counters[p] = counter
            self._state_shapes[p] = tuple(p.shape)
        if steps:
            engine.set_step_count(int(steps))
        self._pushed.append([self._group_hypers(group) if faces[g] is face else None
                             for g, group in enumerate(self.param_groups)])
        made = _Bound(engine, params, grads, slots,
                      [(k, *copies[(g, i)]) for k, (g, i, _) in enumerate(params)
                       if (g, i) in copies])
        made.counter, made.shown = counter, shown
        made.face = face
        return made

    def _steps_edited_in_place(self):
        """Whether user code wrote into a state[p]['step'] since the last step (host engines:
        one comparison each; on a device that would wait for the device, so an in-place edit
        there is not followed: assign a new tensor)."""
        return any(b.counter.device.type == "cpu" and
                   not torch.equal(b.shown, b.counter.expand(b.shown.shape))
                   for b in self._engines)

    def _reduction_group(self):
        """The process group each reduction pass's totals are combined over: the shards' (a
        DTensor model's), the one given (or ZeroRedundancyOptimizer's), else None."""
        return self._shards.group if self._shards is not None else self._process_group

    def _shown(self, view, kind, p):
        """A state view as opt.state shows it: a complex param's element states complex, as
        torch keeps them; for a DTensor param the DTensor torch keeps (Shards.wrap); else the
        view."""
        if p.is_complex() and kind in ("element", "master") and view.dtype in (torch.float32,
                                                                               torch.float64):
            view = torch.view_as_complex(view)
        if self._shards is None:
            return view
        shown = self._shards.wrap(view, p, kind)
        return view if shown is None else shown

    def _views(self, engine, slot, p):
        """The engine's state of one param (p: the tensor the engine binds) as torch tensors
        (views, no copy), by torch's names: key -> (view, kind)."""
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
                kind = "element" if view.dtype != torch.uint8 else "codes8"
                if view.dtype != torch.uint8 or \
                        not self._opts.storage.get(name, "-").startswith("q4"):
                    view = view.view(p.shape)
                else:
                    kind = "codes4"
                out[key] = (view, kind)
            elif kind == "absmax":
                base = name[:-len(".absmax")]
                view = engine.state(name, slot, "flat")
                if view.numel():  # this param's state is quantized
                    out[self._names.get(base, base) + ".absmax"] = (view, kind)
            elif kind == "scalar":
                out[key] = (engine.state(name, slot, "scalar"), kind)
            elif kind == "row":
                # torch's Adafactor keeps a 1-D param's full variance as "variance": our row
                # state of its numel rows.
                if self._preset == "adafactor" and p.dim() < 2:
                    key = "variance"
                out[key] = (engine.state(name, slot, "flat").view(rows), kind)
            elif kind == "col":
                out[key] = (engine.state(name, slot, "flat").view(cols), kind)
            elif kind == "master" and p.dtype in (torch.float16, torch.bfloat16):
                out["master"] = (engine.state("master", slot, "param"), kind)
        return out

    def _rebind_moved(self, bound, stream):
        """Re-points the engine at grads (and params) that moved since the last step; False
        when one changed its dtype or shape (the caller plans again)."""
        grads = [p.grad for p in bound.tensors]
        pptrs = [local_ptr(p) for p in bound.tensors]
        gptrs = [local_ptr(g) for g in grads]
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
                # A new grad at the old address may be laid otherwise (a transposed view).
                if grad is not last[k] and not moved_g and \
                        bound.copies_of.get(k, (None, None))[1] is None and \
                        not bindable(grad).is_contiguous():
                    return False
            if moved_p and (p.dtype != bound.dtypes[k] or p.shape != bound.shapes[k]):
                return False
            copy = bound.copies_of.get(k, (None, None))
            if moved_p and (copy[0] is not None or not bindable(p).is_contiguous()):
                return False  # a param bound as a copy, or to be one: planned again
            if moved_g and copy[1] is None and not bindable(grad).is_contiguous():
                return False  # a grad to be bound as a copy
            if moved_p:
                self._check(g, i, p, grad, bound.device)
            elif moved_g and (grad.is_sparse or grad.device != bound.device):
                self._check(g, i, p, grad, bound.device)  # raises, saying which and why
            new_params.append(pptrs[k] if moved_p else 0)
            # A grad bound as a copy stays bound: the copy is filled from the new one.
            new_grads.append(gptrs[k] if moved_g and copy[1] is None else 0)
        bound.engine.rebind(new_params, new_grads, stream)
        # Committed only once the engine took them (a refusal changes nothing).
        bound.grads = [weakref.ref(g) for g in grads]
        bound.pptrs = pptrs
        bound.gptrs = gptrs
        return True

    def _unmoved(self):
        """True when every param and grad is the object, and at the address, it was at the
        end of the last step (so the engines point at them all): the per-tensor work of a
        steady step is this one check, in C++ (_C._Watch) for local tensors."""
        last = self._last
        if self._key is None or last is None:
            return False
        if isinstance(last, _C._Watch):
            return last.unmoved(self.param_groups)
        flat = [p for group in self.param_groups for p in group["params"]]
        return (len(flat) == len(last[0]) and all(map(operator.is_, flat, last[0]))
                and all(map(operator.is_, map(GRAD, flat), [ref() for ref in last[1]]))
                and list(map(local_ptr, flat)) == last[2]
                and list(map(local_ptr, map(GRAD, flat))) == last[3])

    def _remember(self, flat, grads):
        """Every param, its grad (weakly) and their addresses as this step leaves them: in a
        _C._Watch, or (DTensors: their local shards' addresses) in Python."""
        if self._shards is None:
            self._last = _C._Watch()
            self._last.remember(self.param_groups)
            return
        self._last = (flat, [none_ref if g is None else weakref.ref(g) for g in grads],
                      list(map(local_ptr, flat)), list(map(local_ptr, grads)))

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

    def _stream(self, device):
        if device.type == "cuda":
            return torch.cuda.current_stream(device).cuda_stream
        return 0

