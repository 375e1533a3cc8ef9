"""fusedopt.torch over sharded params: the process group a ZeroRedundancyOptimizer builds this
optimizer in, and the reduction hook that combines each reduction pass's totals across the
ranks."""

import contextlib
import sys
import weakref

import torch

from ..errors import UsageError

__all__ = ["zero_process_group", "reduction_hook", "is_dtensor", "local", "local_ptr", "Shards",
           "plan_shards"]


def zero_process_group():
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


def reduction_hook(optimizer):
    """The engine's reduction hook for `optimizer` (held weakly: the engine it is set on
    belongs to the optimizer): each call's partials combined over its reduction group."""
    ref = weakref.ref(optimizer)

    def hook(pass_, stage, totals, slots, tensor_totals, shard, shard_max, stream):
        owner = ref()
        if owner is not None:
            pieces = owner._shards is not None
            _combine(owner._reduction_group(), totals, slots,
                     tensor_totals if pieces else [], shard, shard_max, stream)
    return hook


def _combine(group, totals, slots, tensor_totals, shard, shard_max, stream):
    """One call's partials of every rank of `group`, combined in place: the global slots
    listed, the per-tensor columns listed (`tensor_totals`: given for pieces of tensors, FSDP;
    empty when each param lives whole on one rank, ZeRO) and the `shard` sums, gathered in one
    collective (float64) and summed in rank order, or the max where the slot says so: every
    rank gets the same bits."""
    glob = [(index, by_max) for _, per_tensor, index, by_max in slots if not per_tensor]
    cols = [(index, by_max) for _, per_tensor, index, by_max in slots if per_tensor]
    parts, flags = [], []
    if glob:
        parts.append(totals[[i for i, _ in glob]])
        flags += [m for _, m in glob]
    for t in tensor_totals if cols else []:
        if t.numel():
            parts.append(t[:, [i for i, _ in cols]].reshape(-1))
            flags += [m for _, m in cols] * t.shape[0]
    if shard.numel():
        parts.append(shard)
        maxed = set(shard_max)
        flags += [k in maxed for k in range(shard.numel())]
    if not parts:
        return
    world = torch.distributed.get_world_size(group)
    on_stream = contextlib.nullcontext()
    if totals.is_cuda:  # ordered after the pass that wrote them, on the optimizer's stream
        cuda_stream = torch.cuda.ExternalStream(stream) if stream else \
            torch.cuda.default_stream(totals.device)
        on_stream = torch.cuda.stream(cuda_stream)
    with on_stream:
        mine = torch.cat(parts)
        every = [torch.empty_like(mine) for _ in range(world)]
        torch.distributed.all_gather(every, mine, group=group)
        out = every[0].clone()
        by_max = torch.tensor(flags, dtype=torch.bool, device=mine.device)
        for other in every[1:]:  # in rank order
            out = torch.where(by_max, torch.maximum(out, other), out + other)
        k = 0
        if glob:
            totals[[i for i, _ in glob]] = out[:len(glob)]
            k = len(glob)
        for t in tensor_totals if cols else []:
            if t.numel():
                n = t.shape[0] * len(cols)
                t[:, [i for i, _ in cols]] = out[k:k + n].reshape(t.shape[0], len(cols))
                k += n
        if shard.numel():
            shard.copy_(out[k:])


# ---- FSDP2: DTensor params ----------------------------------------------------------------

def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor  # torch >= 2.4
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor  # torch 2.0 to 2.3
        except ImportError:
            return None  # torch 1.x: no DTensor
    return DTensor


DTensor = _dtensor_class()


def is_dtensor(t):
    return DTensor is not None and isinstance(t, DTensor)


def local(t):
    """What an engine binds of a param or grad: a DTensor's local shard, else the tensor."""
    return t.to_local() if DTensor is not None and isinstance(t, DTensor) else t


def local_ptr(t):
    """The address an engine binds of a param or grad (a DTensor's data_ptr() is 0)."""
    if t is None:
        return 0
    try:
        return t.to_local().data_ptr() if DTensor is not None and isinstance(t, DTensor) else \
            t.data_ptr()
    except RuntimeError:  # no storage (a sparse grad): the step's check refuses it
        return -1


def _kind(placement):
    name = type(placement).__name__
    if name == "Shard":
        return "shard0" if placement.dim == 0 else "other"
    return "replicate" if name == "Replicate" else "other"


class Shards:
    """How one optimizer's DTensor params lie on their mesh: each is cut on dim 0 over one mesh
    dimension (FSDP2's Shard(0)) and replicated over the others (HSDP's Replicate()). Every
    reduction that spans a tensor's pieces is combined over that dimension's group."""

    def __init__(self, mesh, placements):
        self.mesh = mesh
        self.placements = tuple(placements)
        self.dim = [_kind(x) for x in placements].index("shard0")
        self.group = mesh.get_group(self.dim)
        self.world = mesh.size(self.dim)
        self.rank = mesh.get_local_rank(self.dim)

    def piece(self, p):
        """(the whole shape, the dim-0 index where this rank's piece starts): torch.chunk's
        cut, as FSDP2 and DTensor's Shard(0) make it."""
        rows = p.shape[0]
        per = -(-rows // self.world)
        return tuple(p.shape), min(self.rank * per, rows)

    def wrap(self, view, p, kind):
        """A state `view` (this rank's, of param p) as the DTensor torch's FSDP2 optimizers
        keep: the param's placement for what is cut with it (element states, masters, 8-bit
        codes, the row states of a param's rows), replicated where every rank holds the same
        values (scalar states, the column states of a 1-D or 2-D param, whose pieces share
        their columns). None: it has no DTensor form (4-bit codes and absmax blocks lie in
        the rank's piece: kept as this rank's tensor)."""
        replicate = self._replicated()
        shape = tuple(p.shape)
        if kind in ("element", "master", "codes8"):
            return DTensor.from_local(view, self.mesh, self.placements, run_check=False,
                                      shape=p.shape, stride=p.stride())
        if kind == "row":
            whole = shape[:-1] + (1,) if len(shape) >= 2 else shape
            return self._from_local(view, self.placements, whole)
        if kind == "col" and len(shape) >= 3:
            return self._from_local(view, self.placements, shape[:-2] + (1, shape[-1]))
        if kind in ("col", "scalar"):
            return self._from_local(view, replicate, tuple(view.shape))
        return None

    def _replicated(self):
        replicate = [x for x in self.placements if _kind(x) == "replicate"]
        if replicate:
            return [replicate[0]] * len(self.placements)
        from torch.distributed.tensor import Replicate
        return [Replicate()] * len(self.placements)

    def _from_local(self, view, placements, whole):
        stride, acc = [], 1
        for n in reversed(whole):
            stride.append(acc)
            acc *= n
        return DTensor.from_local(view, self.mesh, placements, run_check=False,
                                  shape=torch.Size(whole), stride=tuple(reversed(stride)))


def plan_shards(members, who):
    """The Shards of the params `members` ([(group, index, param)], those with grads), None
    when none is a DTensor; UsageError naming the param for what fusedopt does not step: a
    placement other than Shard(0) and Replicate() (tensor parallel's Shard(1), Partial), a
    second mesh, plain tensors beside DTensors, a grad laid otherwise than its param."""
    dts = [(g, i, p) for g, i, p in members if is_dtensor(p)]
    if not dts:
        for g, i, p in members:
            if is_dtensor(p.grad):
                raise UsageError(f"{who(g, i)}: its gradient is a DTensor, the param is not")
        return None
    if len(dts) != len(members):
        g, i, _ = next(m for m in members if not is_dtensor(m[2]))
        g0, i0, _ = dts[0]
        raise UsageError(f"{who(g, i)} is a plain tensor, but {who(g0, i0)} is a DTensor: one "
                         "fusedopt Optimizer steps the shards of a sharded model (FSDP2) or "
                         "whole params, not both")
    first = None
    for g, i, p in dts:
        kinds = [_kind(x) for x in p.placements]
        if kinds.count("shard0") != 1 or "other" in kinds:
            raise UsageError(
                f"{who(g, i)}: a DTensor placed {tuple(p.placements)} on {p.device_mesh}; "
                "fusedopt steps params cut on dim 0 over one mesh dimension (FSDP2's "
                "Shard(0)), replicated over the others (HSDP), not tensor-parallel or "
                "partial placements")
        if first is None:
            first = (g, i, p)
        elif p.device_mesh != first[2].device_mesh or \
                tuple(p.placements) != tuple(first[2].placements):
            raise UsageError(f"{who(g, i)} is placed {tuple(p.placements)} on {p.device_mesh}, "
                             f"{who(first[0], first[1])} {tuple(first[2].placements)} on "
                             f"{first[2].device_mesh}: one fusedopt Optimizer steps params of "
                             "one mesh and placement (build one per mesh)")
        grad = p.grad
        if not is_dtensor(grad) or grad.device_mesh != p.device_mesh or \
                tuple(grad.placements) != tuple(p.placements):
            placed = tuple(grad.placements) if is_dtensor(grad) else "a plain tensor"
            raise UsageError(f"{who(g, i)}: its gradient is {placed}, the param "
                             f"{tuple(p.placements)}: step after the gradients are reduced "
                             "(FSDP2 reduce-scatters them in backward)")
    shards = Shards(first[2].device_mesh, first[2].placements)
    for g, i, p in dts:
        whole, offset = shards.piece(p)
        rows = local(p).shape[0] if p.dim() else 0
        if p.dim() == 0 or rows != max(0, min(-(-whole[0] // shards.world), whole[0] - offset)):
            raise UsageError(f"{who(g, i)}: its local shard has {tuple(local(p).shape)} of "
                             f"{whole} on rank {shards.rank} of {shards.world}; fusedopt "
                             "expects torch.chunk's cut on dim 0 (FSDP2's)")
    return shards
