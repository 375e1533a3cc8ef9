#!/usr/bin/env python3
"""One AdamW step on BERT-base shapes (201 tensors, 109.5 M fp32 elements, torch's shapes):
fusedopt.torch.Optimizer against torch.optim.AdamW(foreach=True) and (foreach=False), in the
same run, on the same data, with the copy floor measured here.

AdamW moves 28 bytes per element and step (param read + written, grad read, exp_avg and
exp_avg_sq read + written); the floor is a plain copy of the same bytes (half read, half
written: dst.copy_(src) of 14 bytes per element; on the CPU the faster of that and
numpy.copyto), its best time, as fusedopt-bench measures it. Each optimizer line reports
the median of --steps timed steps after --warmup untimed ones, and the fraction of the
floor.

  python3 bench/torch_step.py [--device cpu|cuda] [--steps N] [--threads N] [--json FILE]
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch

import fusedopt
import fusedopt.torch as ft


def bert_base_shapes():
    h, ffn = 768, 3072
    shapes = [(30522, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(12):
        for _ in range(4):  # query, key, value, attention output
            shapes += [(h, h), (h,)]
        shapes += [(h,), (h,), (ffn, h), (ffn,), (h, ffn), (h,), (h,), (h,)]
    shapes += [(h, h), (h,), (2, h), (2,)]
    return shapes


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timer(device):
    if device == "cuda":
        def run(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def run(fn):
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    return run


def median_seconds(fn, device, steps, warmup, best=False):
    run = timer(device)
    for _ in range(warmup):
        run(fn)
    times = [run(fn) for _ in range(steps)]
    return min(times) if best else statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch's CPU threads (default: every core, as fusedopt's OpenMP "
                         "kernel uses)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = args.device
    torch.manual_seed(0)
    shapes = bert_base_shapes()
    elements = sum(torch.Size(s).numel() for s in shapes)
    bytes_per_step = 28 * elements

    def fresh():
        ps = [torch.randn(s, device=device).requires_grad_() for s in shapes]
        for p in ps:
            p.grad = torch.randn_like(p) * 1e-3
        return ps

    # The floor: copying 14 bytes per element (read once, written once).
    src = torch.randn(7 * elements // 2, device=device)  # 14 bytes / element as fp32
    dst = torch.empty_like(src)
    floor = median_seconds(lambda: dst.copy_(src), device, args.steps, args.warmup, best=True)
    if device == "cpu":  # and numpy's copy (one thread, often the faster on few cores)
        import numpy
        a, b = src.numpy(), dst.numpy()
        floor = min(floor, median_seconds(lambda: numpy.copyto(b, a), device, args.steps,
                                          args.warmup, best=True))
    del src, dst

    results = []

    def measure(name, make):
        ps = fresh()
        opt = make(ps)
        seconds = median_seconds(opt.step, device, args.steps, args.warmup)
        results.append({"name": name, "seconds": seconds, "floor_fraction": floor / seconds})
        del opt, ps

    measure("fusedopt.torch.Optimizer(rule='adamw')",
            lambda ps: ft.Optimizer(ps, rule="adamw", lr=1e-3))
    measure("torch.optim.AdamW(foreach=True)",
            lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True))
    measure("torch.optim.AdamW(foreach=False)",
            lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False))
    if device == "cuda":
        measure("torch.optim.AdamW(fused=True)",
                lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True))

    machine = {
        "device": torch.cuda.get_device_name() if device == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fusedopt": fusedopt.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"AdamW step, BERT-base shapes: {len(shapes)} tensors, {elements / 1e6:.1f} M "
          f"elements, {bytes_per_step / 1e9:.2f} GB moved per step; device {device} "
          f"({machine['device']}, {machine['threads']} threads), torch {machine['torch']}")
    print(f"copy floor (the same bytes, a plain copy): {floor * 1e3:.1f} ms "
          f"({bytes_per_step / floor / 1e9:.1f} GB/s)")
    base = next(r["seconds"] for r in results if r["name"].endswith("(foreach=True)"))
    for r in results:
        print(f"  {r['name']:42s} {r['seconds'] * 1e3:8.1f} ms   {r['floor_fraction']:.2f} of "
              f"the floor   {base / r['seconds']:.2f}x foreach")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "tensors": len(shapes), "elements": elements,
                       "bytes_per_step": bytes_per_step, "floor_seconds": floor,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
