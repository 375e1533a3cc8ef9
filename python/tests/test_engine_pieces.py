"""The engine over dim-0 pieces of params (_GroupSpec.wholes, PyTorch FSDP2's sharding): at 2
and 3 gloo ranks on the CPU (spawned with torch.multiprocessing), each rank's engine over
its rows of every param (uneven, the last rank's piece of one param empty), with a reduction
hook that all-reduces what the hook contract says (fn(pass, stage, totals, slots,
tensor_totals, shard, shard_max, stream)); against one engine over the whole params, within
fp32 rounding of the sums' order.
"""
import gc
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fusedopt
from fusedopt import _fusedopt as _C

STEPS = 4
# The last two have an empty piece at 3 ranks and at 2.
SHAPES = [(29,), (17, 6), (5, 3, 4), (2, 5), (1,)]


def pieces(shape, world):
    """FSDP2's split of dim 0: ceil(rows / world) rows per rank, the last ranks fewer or none."""
    per = -(-shape[0] // world)
    return [(min(r * per, shape[0]), min((r + 1) * per, shape[0])) for r in range(world)]


def data(seed):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g) for s in SHAPES]
    grads = [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(STEPS)]
    return params, grads


def engine(rule, params, grads, wholes=None):
    spec = _C._GroupSpec()
    spec.params = params
    spec.grads = grads
    spec.names = [f"w{i}" for i in range(len(params))]
    spec.hypers = []
    if wholes is not None:
        spec.wholes = wholes
    return _C._Engine(fusedopt.Rule.preset(rule), [spec], _C._Options())


def combine(pass_, stage, totals, slots, tensor_totals, shard, shard_max, stream):
    """The hook contract over gloo: this call's global slots and per-tensor columns (sum or
    max), all of the shard (sum, or max at shard_max)."""
    for _, per_tensor, index, by_max in slots:
        op = dist.ReduceOp.MAX if by_max else dist.ReduceOp.SUM
        if per_tensor:
            for t in tensor_totals:
                column = t[:, index].clone()
                dist.all_reduce(column, op=op)
                t[:, index] = column
        else:
            value = totals[index:index + 1].clone()
            dist.all_reduce(value, op=op)
            totals[index] = value[0]
    if shard.numel():
        assert not shard_max  # the means' sums: no max today
        dist.all_reduce(shard)


def rank_main(rank, world, rule, seed, init_file, out_dir):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        torch.set_num_threads(1)
        whole, grads = data(seed)
        bounds = [pieces(p.shape, world)[rank] for p in whole]
        mine = [p[a:b].clone() for p, (a, b) in zip(whole, bounds)]
        my_grads = [torch.empty_like(p) for p in mine]
        e = engine(rule, mine, my_grads,
                   [(list(p.shape), a) for p, (a, _) in zip(whole, bounds)])
        e.set_reduction_hook(combine)
        for step in range(STEPS):
            for g, full, (a, b) in zip(my_grads, grads[step], bounds):
                g.copy_(full[a:b])
            e.step()
        torch.save(mine, os.path.join(out_dir, f"rank{rank}.pt"))
        e.set_reduction_hook(None)
    finally:
        gc.collect()
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("rule", ["adamw", "lamb", "adafactor", "came"])
def test_pieces_over_gloo_ranks_match_the_whole_params(world, rule):
    seed = 20261128 + world
    whole, grads = data(seed)
    assert any(a == b for p in whole for a, b in pieces(p.shape, world))  # an empty piece
    g = [torch.empty_like(p) for p in whole]
    ref = engine(rule, whole, g)
    for step in range(STEPS):
        for x, y in zip(g, grads[step]):
            x.copy_(y)
        ref.step()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rank_main, args=(world, rule, seed, os.path.join(d, "init"), d), nprocs=world,
                 join=True)
        got = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(world)]
    for i, p in enumerate(whole):
        joined = torch.cat([got[r][i] for r in range(world)])
        err = ((joined - p).abs().max() / p.abs().max()).item()
        assert err <= 1e-5, f"{rule} at {world} ranks: param {i} differs by {err:.3g}"


def test_wholes_need_one_entry_per_param():
    p = [torch.randn(4, 3)]
    with pytest.raises(fusedopt.UsageError, match="one \\(shape, offset\\) per param"):
        engine("adamw", p, [torch.randn(4, 3)], [([8, 3], 0), ([8, 3], 4)])
    with pytest.raises(fusedopt.UsageError, match="rows \\[6, 10\\) of dim 0"):
        engine("adamw", p, [torch.randn(4, 3)], [([8, 3], 6)])
