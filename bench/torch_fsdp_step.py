#!/usr/bin/env python3
"""One optimizer step under FSDP2 (fully_shard: every param a DTensor cut on dim 0), on
BERT-base's shapes (201 tensors, 109.5 M elements), at --ranks gloo ranks on the CPU (each rank
its share of the cores: OMP_NUM_THREADS, which fusedopt's kernels and torch both read) or NCCL
ranks on GPUs: fusedopt.torch.Optimizer's `adamw` against torch.optim.AdamW with foreach=True
and fused=True, in the same run, over the same shards, with the in-place floor of the bytes
fusedopt's step moves on each rank's shards beside them: torch operations over buffers of the
same sizes (each read-only role summed, each updated role incremented in place, each
write-only role filled; the ranks measure it together, as they step together). Each line: the
median of --steps timed steps after --warmup untimed ones, the slowest rank's, and the
fraction of the slowest rank's floor.

  python3 bench/torch_fsdp_step.py [--ranks 2] [--steps 10] [--warmup 2] [--json FILE]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import bert_base_shapes, cpu_name  # noqa: E402


class Shapes(torch.nn.Module):
    """A module holding params of the given shapes, in blocks of `per` (one fully_shard each,
    as a transformer's layers would be)."""

    def __init__(self, shapes, per=16):
        super().__init__()
        self.blocks = torch.nn.ModuleList()
        for k in range(0, len(shapes), per):
            block = torch.nn.Module()
            block.ps = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes[k:k + per]])
            self.blocks.append(block)


def inplace_floor(traffic, device, runs=5):
    """Best time of torch operations moving the bytes of `traffic` (an engine's
    stats()['traffic']) in place: per pass, each read-only role added into an updated role of
    its size (u.add_(r): one stream over both), the other updated roles incremented, the
    other read-only ones summed, the write-only ones filled."""
    ops = []
    for p in traffic:
        def buf(bits):
            return torch.ones(max(1, (p["elements"] * bits + 31) // 32), device=device)
        reads = [buf(b) for b in p["read_bits"]]
        updates = [buf(b) for b in p["update_bits"]]
        for u in updates:
            r = next((r for r in reads if r.numel() == u.numel()), None)
            if r is not None:
                reads.remove(r)
                ops.append(lambda u=u, r=r: u.add_(r))
            else:
                ops.append(lambda u=u: u.add_(1))
        ops += [lambda r=r: r.sum() for r in reads]
        ops += [lambda w=w: w.fill_(1) for w in map(buf, p["write_bits"])]

    def run():
        for op in ops:
            op()
    return median_step(run, runs, 1, device, best=True)


def median_step(step, steps, warmup, device, best=False):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times) if best else statistics.median(times)


def rank_main(rank, world, args, init_file, out_file):
    from torch.distributed.fsdp import fully_shard
    import fusedopt.torch as ft
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.manual_seed(0)
    results = {}
    with torch.device(args.device):
        model = Shapes(bert_base_shapes())
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3  # a DTensor grad with the param's placement
    local = sum(p.to_local().numel() for p in params)
    variants = [("fusedopt adamw", lambda: ft.Optimizer(params, rule="adamw", lr=1e-4)),
                ("torch AdamW foreach", lambda: torch.optim.AdamW(params, lr=1e-4,
                                                                  foreach=True)),
                ("torch AdamW fused", lambda: torch.optim.AdamW(params, lr=1e-4, fused=True))]
    floor = None
    for name, make in variants:
        try:
            opt = make()
            dist.barrier()  # the ranks step together, as in training
            seconds = median_step(opt.step, args.steps, args.warmup, args.device)
        except Exception as e:  # e.g. fused=True where this torch has no such kernel
            results[name] = f"{type(e).__name__}: {e}"
            continue
        if name.startswith("fusedopt"):
            dist.barrier()
            floor = inplace_floor(opt.stats()[0]["traffic"], args.device)
        results[name] = seconds
        del opt
    every = [None] * world
    dist.all_gather_object(every, {"results": results, "floor": floor, "elements": local})
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(every, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    # Each rank its share of the cores, for torch and fusedopt's OpenMP kernels alike.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.ranks)))
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        mp.spawn(rank_main, args=(args.ranks, args, os.path.join(d, "init"), out),
                 nprocs=args.ranks, join=True)
        with open(out) as f:
            ranks = json.load(f)
    print(f"FSDP2, {args.ranks} {args.device} ranks of {os.environ['OMP_NUM_THREADS']} "
          f"thread(s), BERT-base shapes (201 tensors, "
          f"109.5 M elements; rank 0 holds {ranks[0]['elements'] / 1e6:.1f} M), torch "
          f"{torch.__version__}, {cpu_name() if args.device == 'cpu' else 'GPU'}, "
          f"{datetime.date.today()}")
    floors = [r["floor"] for r in ranks]
    if all(floors):
        print(f"  in-place floor (the slowest rank's):  {max(floors) * 1e3:8.2f} ms")
    summary = {"ranks": args.ranks, "device": args.device, "torch": torch.__version__,
               "host": platform.node(), "cpu": cpu_name(), "floor_s": max(floors) if all(
                   floors) else None, "variants": {}}
    for name in ranks[0]["results"]:
        values = [r["results"][name] for r in ranks]
        if any(isinstance(v, str) for v in values):
            print(f"  {name:24s}  not run: {next(v for v in values if isinstance(v, str))}")
            summary["variants"][name] = next(v for v in values if isinstance(v, str))
            continue
        slowest = max(values)
        share = f"  {max(floors) / slowest:6.1%} of the floor" if all(floors) else ""
        if all(floors) and slowest < max(floors):
            share += " (above 100%: this floor is no floor here)"
        print(f"  {name:24s}  {slowest * 1e3:8.2f} ms{share}")
        summary["variants"][name] = slowest
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
