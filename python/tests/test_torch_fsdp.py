"""fusedopt.torch.Optimizer under FSDP2 (torch.distributed.fsdp.fully_shard: DTensor params cut
on dim 0), at 2 and 4 gloo ranks on the CPU and with HSDP (a 2 x 2 mesh: replicate x shard):
for each rule, the params after STEPS steps equal one process's unsharded run on the whole
batch, within fp32 rounding. The model has uneven shards (5 rows over 4 ranks: 2, 2, 1, 0),
empty ones, 1-D, 2-D and 3-D params. The ranks are spawned once per mesh (torch.multiprocessing)
and run every rule; each test compares one rule's result.
"""
import contextlib
import datetime
import functools
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fusedopt
import fusedopt.torch as ft

fully_shard = None  # torch < 2.6 has no public FSDP2 (1.13's fsdp does not import on 3.11)
if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 6) and dist.is_available():
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.device_mesh import init_device_mesh

needs_fsdp2 = pytest.mark.skipif(
    fully_shard is None or not dist.is_available(),
    reason=f"FSDP2 (torch.distributed.fsdp.fully_shard, DTensor) needs torch >= 2.6; this is "
           f"torch {torch.__version__}")

STEPS = 10
BATCH = 32
# name -> (rule, options and hypers), each checked against the same rule unsharded.
CASES = {
    "adamw": ("adamw", dict(lr=1e-2, weight_decay=0.01)),
    "adamw_clip": ("adamw", dict(lr=1e-2, weight_decay=0.01, max_grad_norm=1.0)),
    "lion": ("lion", dict(lr=1e-3, weight_decay=0.01)),
    "lamb": ("lamb", dict(lr=1e-2, weight_decay=0.01)),
    "lars": ("lars", dict(lr=0.1)),
    "adafactor": ("adafactor", dict(lr=1e-2)),
    "came": ("came", dict(lr=2e-3)),
    "adam_mini": ("adam_mini", dict(lr=1e-2)),
    "adamw8bit": ("adamw8bit", dict(lr=1e-2, quant_min_numel=64, quant_block=32)),
}
# name -> (world size, mesh shape): a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate, shard).
MESHES = {"fsdp2": (2, (2,)), "fsdp4": (4, (4,)), "hsdp4": (4, (2, 2))}


class Block(torch.nn.Module):
    """A 3-D param (its matrices cut on dim 0: 3 over 2 ranks is 2 and 1, over 4: 1, 1, 1, 0)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 6, 6) / 6)

    def forward(self, h):
        return torch.einsum("bij,kjl->bil", h.reshape(h.shape[0], 4, 6), self.weight).reshape(
            h.shape[0], 24)


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), Block(),
                               torch.nn.Linear(24, 5), torch.nn.Linear(5, 3))


def batches(seed):
    g = torch.Generator().manual_seed(seed)
    # Targets far from the start: the global norm is above max_grad_norm at every step.
    return [(torch.randn(BATCH, 12, generator=g), 20 * torch.randn(BATCH, 3, generator=g))
            for _ in range(STEPS)]


def train(model, opt, data, part=slice(None)):
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
        opt.step()


@functools.lru_cache(maxsize=None)
def unsharded(case, seed):
    rule, kwargs = CASES[case]
    model = make_model()
    opt = ft.Optimizer(model.parameters(), rule=rule, **kwargs)
    train(model, opt, batches(seed))
    return [p.detach().clone() for p in model.parameters()]


def rank_main(rank, world, mesh_shape, seed, init_file, out_file):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # A bounded wait: a rank that fails alone makes the others fail, not hang.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    try:
        names = ("replicate", "shard") if len(mesh_shape) == 2 else ("shard",)
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        results = {}
        for case, (rule, kwargs) in CASES.items():
            model = make_model()
            for layer in model:
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            try:
                opt = ft.Optimizer(model.parameters(), rule=rule, **kwargs)
                share = BATCH // world
                train(model, opt, batches(seed), slice(rank * share, (rank + 1) * share))
                # Element states are DTensors with the param's placement (absmax blocks lie
                # in this rank's piece: a plain tensor).
                w = model[0].weight
                for k, v in opt.state[w].items():
                    if k != "step" and not k.endswith(".absmax"):
                        assert isinstance(v, DTensor), k
                        assert v.shape != w.shape or v.placements == w.placements, k
                results[case] = [p.full_tensor().detach().clone() for p in model.parameters()]
            except Exception as e:  # reported by the test of this case
                results[case] = f"{type(e).__name__}: {e}"
                dist.barrier()
        if rank == 0:
            torch.save(results, out_file)
    finally:
        dist.destroy_process_group()


@functools.lru_cache(maxsize=None)
def sharded(mesh, seed):
    world, shape = MESHES[mesh]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "results.pt")
        mp.spawn(rank_main, args=(world, shape, seed, os.path.join(d, "init"), out),
                 nprocs=world, join=True)
        return torch.load(out)


@pytest.fixture(scope="module")
def module_seed():
    value = int(os.environ.get("FUSEDOPT_TEST_SEED", torch.randint(2**31, ()).item()))
    print(f"seed {value} (FUSEDOPT_TEST_SEED={value} replays it)")
    return value


@needs_fsdp2
@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("case", list(CASES))
def test_fsdp2_params_equal_the_unsharded_run(case, mesh, module_seed):
    got = sharded(mesh, module_seed)[case]
    assert not isinstance(got, str), f"{case} on {mesh}: {got}"
    want = unsharded(case, module_seed)
    rule, kwargs = CASES[case]
    for i, (a, b) in enumerate(zip(got, want)):
        if rule.endswith("8bit"):
            # Blocks lie within each rank's piece, so their absmax (and a code's rounding)
            # differ from the unsharded run's: each step's update may differ by a small part
            # of lr (the C++ test of pieces measures it: about 5% of lr at 8 bits).
            err = (a - b).abs().max().item()
            assert err <= 0.25 * kwargs["lr"] * STEPS, \
                f"{case} on {mesh}: parameter {i} differs by {err:.3g} (lr {kwargs['lr']})"
            continue
        err = ((a - b).abs().max() / b.abs().max()).item()
        assert err <= 5e-5, f"{case} on {mesh}: parameter {i} {tuple(b.shape)} differs by " \
                            f"{err:.3g} (relative)"


@contextlib.contextmanager
def one_rank_mesh():
    """A process group of this process alone and its 1-D mesh, for what needs no other rank
    (the refusals)."""
    with tempfile.TemporaryDirectory() as d:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"file://{d}/init", rank=0, world_size=1)
        try:
            yield init_device_mesh("cpu", (1,))
        finally:
            dist.destroy_process_group()


@needs_fsdp2
@pytest.mark.parametrize("case", ["plain-beside-dtensor", "plain-grad", "partial-grad",
                                  "process-group"])
def test_what_fsdp2_cannot_step_is_a_usage_error_naming_the_param(case):
    from torch.distributed.tensor import Partial, Shard
    with one_rank_mesh() as mesh:
        p = torch.nn.Parameter(DTensor.from_local(torch.randn(4, 6), mesh, [Shard(0)]))
        p.grad = DTensor.from_local(torch.randn(4, 6), mesh, [Shard(0)])
        params, kwargs = [p], {}
        if case == "plain-beside-dtensor":
            q = torch.nn.Parameter(torch.randn(3))
            q.grad = torch.randn(3)
            params, match = [p, q], r"\['params'\]\[1\] is a plain tensor, but " \
                                    r"param_groups\[0\]\['params'\]\[0\] is a DTensor"
        elif case == "plain-grad":
            p.grad = None
            p.grad = torch.randn(4, 6)
            match = r"\['params'\]\[0\]: its gradient is a plain tensor"
        elif case == "partial-grad":
            p.grad = DTensor.from_local(torch.randn(4, 6), mesh, [Partial()])
            match = r"\['params'\]\[0\]: its gradient is \(Partial"
        else:
            kwargs = dict(process_group=dist.new_group([0]))
            match = "give no process_group"
        opt = ft.Optimizer(params, rule="adamw", **kwargs)
        before = p.to_local().clone()
        with pytest.raises(fusedopt.UsageError, match=match):
            opt.step()
        assert torch.equal(p.to_local(), before)  # refused: nothing stepped


@needs_fsdp2
def test_a_tensor_parallel_placement_is_refused_naming_the_param():
    from torch.distributed.tensor import Shard
    with one_rank_mesh() as mesh:
        p = torch.nn.Parameter(DTensor.from_local(torch.randn(4, 6), mesh, [Shard(1)]))
        p.grad = DTensor.from_local(torch.randn(4, 6), mesh, [Shard(1)])
        opt = ft.Optimizer([p], rule="adamw")
        with pytest.raises(fusedopt.UsageError, match=r"param_groups\[0\]\['params'\]\[0\]: "
                                                      r"a DTensor placed \(Shard\(dim=1\),\)"):
            opt.step()


# ---- torch.distributed.checkpoint: save at 4 ranks, load at 2, and back ---------------------

DCP_RULE = ("adamw", dict(lr=1e-2, weight_decay=0.01, max_grad_norm=1.0))


def dcp_rank(rank, world, phase, seed, folder, init_file, out_file):
    """One phase of a run that stops and goes on at another world size: steps [first, last) of
    the data, loading the model and optimizer from `folder` first (but for phase 0) and saving
    them there after."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
        set_model_state_dict, set_optimizer_state_dict)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = make_model()
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        rule, kwargs = DCP_RULE
        opt = ft.Optimizer(model.parameters(), rule=rule, **kwargs)
        first, last = PHASES[phase]
        if phase:
            state = {"model": get_model_state_dict(model),
                     "optim": get_optimizer_state_dict(model, opt)}
            dcp.load(state, checkpoint_id=os.path.join(folder, str(phase - 1)))
            set_model_state_dict(model, state["model"])
            set_optimizer_state_dict(model, opt, state["optim"])
            # Loaded and not stepped yet: its state dict still holds DTensors (a save now
            # must write every rank's shard).
            loaded = opt.state_dict()["state"]
            assert loaded and all(isinstance(v, DTensor) for entry in loaded.values()
                                  for k, v in entry.items() if k != "step")
        share = BATCH // world
        train(model, opt, batches(seed)[first:last], slice(rank * share, (rank + 1) * share))
        dcp.save({"model": get_model_state_dict(model),
                  "optim": get_optimizer_state_dict(model, opt)},
                 checkpoint_id=os.path.join(folder, str(phase)))
        full = get_optimizer_state_dict(model, opt, options=StateDictOptions(
            full_state_dict=True))
        params = [p.full_tensor().detach().clone() for p in model.parameters()]
        if rank == 0:
            torch.save({"params": params, "full": full,
                        "names": [n for n, _ in model.named_parameters()]}, out_file)
    finally:
        dist.destroy_process_group()


# phase -> the steps it takes; its world size: PHASE_WORLDS.
PHASES = [(0, 4), (4, 7), (7, STEPS)]
PHASE_WORLDS = [4, 2, 4]


@needs_fsdp2
def test_dcp_save_at_4_ranks_load_at_2_and_back_goes_on_as_the_run_that_never_stopped(
        module_seed):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.pt")
        for phase, world in enumerate(PHASE_WORLDS):
            init = os.path.join(d, f"init{phase}")
            mp.spawn(dcp_rank, args=(world, phase, module_seed, d, init, out), nprocs=world,
                     join=True)
        got = torch.load(out)
    rule, kwargs = DCP_RULE
    model = make_model()
    opt = ft.Optimizer(model.parameters(), rule=rule, **kwargs)
    train(model, opt, batches(module_seed))
    for i, (a, b) in enumerate(zip(got["params"], model.parameters())):
        err = ((a - b).abs().max() / b.abs().max()).item()
        assert err <= 5e-5, f"parameter {i} differs by {err:.3g} (relative)"
    # The full state dict (FQN keys, whole tensors) loads into a one-process fusedopt
    # optimizer and into torch.optim.AdamW: both hold the unsharded run's states.
    full, names = got["full"], got["names"]
    index = {name: k for k, name in enumerate(names)}
    by_index = {"state": {index[n]: s for n, s in full["state"].items()},
                "param_groups": [dict(g, params=[index[n] for n in g["params"]])
                                 for g in full["param_groups"]]}
    for other in (ft.Optimizer(make_model().parameters(), rule=rule, **kwargs),
                  torch.optim.AdamW(make_model().parameters(), lr=1e-2)):
        other.load_state_dict(by_index)
        for k, p in enumerate(other.param_groups[0]["params"]):
            want = opt.state[list(model.parameters())[k]]
            for key in ("exp_avg", "exp_avg_sq"):
                a, b = other.state[p][key], want[key]
                err = ((a - b).abs().max() / b.abs().max()).item()
                assert err <= 5e-5, f"{type(other).__name__}: {key} of {names[k]}: {err:.3g}"
            assert float(other.state[p]["step"]) == STEPS


@needs_fsdp2
def test_the_fsdp_example_runs_under_torchrun_at_two_ranks():
    import subprocess
    import sys
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_fsdp.py")
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node", "2", example, d], capture_output=True,
                             text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "rank 0 of 2" in run.stdout and "DTensors" in run.stdout, run.stdout
        assert os.path.exists(os.path.join(d, ".metadata"))  # DCP's index of the save
