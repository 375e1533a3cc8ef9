#!/usr/bin/env python3
"""fusedopt.torch.Optimizer against torch.optim in the same run, on the same data, with the
floor measured beside them: one optimizer step per case.

Cases (``--cases``, comma-separated):
  adamw      AdamW fp32 on BERT-base shapes (201 tensors, 109.5 M elements, torch's shapes):
             28 B/element (param read + written, grad read, exp_avg and exp_avg_sq read +
             written), against torch.optim.AdamW foreach=True, foreach=False and (CUDA)
             fused=True.
  small      AdamW fp32 over 5,000 tensors of 1 K-64 K elements (a fixed list), the same
             three torch variants.
  amp        CUDA: mixed precision, torch's GradScaler driving each: fusedopt with fp16
             params and grads (torch >= 2's GradScaler checks the grads itself, and its
             check has no bf16 kernel on CUDA), fp32 master and state, the unscale, the
             non-finite skip and clipping by global norm (max_grad_norm) in its launches;
             torch with fp32 params and grads, scaler.unscale_ + clip_grad_norm_ + fused
             AdamW.
  lamb       LAMB on BERT-base (global-norm clipping, per-tensor trust ratios), against
             the same algorithm in torch foreach operations.
  compile    the first step of a fresh optimizer: a cold compile (empty cache), a disk
             hit in a fresh process, a memory hit.
  overhead   the Python front end's cost per tensor: AdamW over 100, 1,000, 10,000 and
             50,000 tensors of 16 elements, the step from Python against the C++ step over
             the same tensors (fusedopt.torch's engine, called directly) in the same run: the
             difference divided by the tensors; torch's AdamW foreach=True (and fused=True
             where torch has it) beside. No floor: it measures overhead, not bandwidth.
  muon       Muon on GPT-2 small's 48 hidden matrices (12 layers of [768, 2304], [768, 768],
             [768, 3072], [3072, 768]; torch's other params belong on AdamW), on the CPU:
             fusedopt.torch.Optimizer(params, "muon") (its Newton-Schulz iteration in fp32
             on the host BLAS; bf16 too where fusedopt.torch takes matrix_precision) against
             torch.optim.Muon (bf16 iteration; skipped, saying so, where torch has none),
             with torch's defaults, and the speedup. Beside them no memory floor but the
             iteration's GEMMs alone in torch fp32 on the same shapes (torch's BLAS: the
             floor of torch's side were it fp32; the GEMM floor of fusedopt's own BLAS is
             fusedopt-bench's --preset muon case). Not in the default --cases: a step takes
             seconds (give --steps 3 --warmup 1).
The floor is an in-place stream of the bytes fusedopt's step moves (its stats()' traffic: per
pass, each role it only reads summed, each it updates incremented in place, each it only
writes filled), its best time: on the CPU fusedopt-bench's floor (bench/floor.hpp, one
OpenMP loop per pass), run by fusedopt-floor (bench/floor/floor_main.cpp, built with the
benchmarks: a program of its own, compiled with the host kernels' flags, -O3 -march=native,
on a team of torch's thread count; --floor-bin says where it is); on a GPU torch operations over buffers of the same sizes (one kernel
per role: the fused step may beat it a little). A plain copy of the same bytes (dst.copy_(src); on the CPU the
faster of that and numpy.copyto) is reported beside it, labelled copy: an in-place update
does not pay for a copy's write-allocate, so a copy is no floor. Each optimizer line is the
median of --steps timed steps after --warmup untimed ones (CUDA events on a GPU), with its
fraction of the floor.

  python3 bench/torch_step.py [--device cpu|cuda] [--cases adamw,small,...] [--steps N]
                              [--threads N] [--floor-bin PATH] [--json FILE]
  python3 bench/torch_step.py --plot FILE.json FILE.png   (this script's --json, or
                                                          fusedopt-bench's)
"""
import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
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


def small_shapes():
    rng = random.Random(5000)
    return [(rng.randint(1024, 65536),) for _ in range(5000)]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def driver_version():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def timer(device):
    if device == "cuda":
        def run(fn):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
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


def seconds(fn, device, steps, warmup, best=False):
    run = timer(device)
    for _ in range(warmup):
        run(fn)
    times = [run(fn) for _ in range(steps)]
    return min(times) if best else statistics.median(times)


def copy_floor(nbytes, device, steps, warmup):
    """Best time of a plain copy moving `nbytes` (read + written)."""
    src = torch.randn(nbytes // 8, device=device)
    dst = torch.empty_like(src)
    best = seconds(lambda: dst.copy_(src), device, steps, warmup, best=True)
    if device == "cpu":
        import numpy
        a, b = src.numpy(), dst.numpy()
        best = min(best, seconds(lambda: numpy.copyto(b, a), device, steps, warmup, best=True))
    return best


def cpu_floor(traffic, runs, floor_bin):
    """The best of `runs` runs of bench/floor.hpp's in-place stream of `traffic`, by
    fusedopt-floor (`floor_bin`) in a process of its own: built as the host kernels are
    (-O3 -march=native; the Python extension, which nanobind builds with -Os, ran the same
    loops 2.4-2.7x slower), on a team of torch's thread count, the team fusedopt's kernels
    get in this process."""
    if not os.access(floor_bin, os.X_OK):
        sys.exit(f"no fusedopt-floor at {floor_bin}: build it (cmake --build BUILD --target "
                 "fusedopt-floor) or name it with --floor-bin")
    passes = [":".join([str(p["elements"])] +
                       [",".join(str(b) for b in p[kind])
                        for kind in ("read_bits", "update_bits", "write_bits")])
              for p in traffic]
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    out = subprocess.run([floor_bin, "--runs", str(runs)] + passes, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0])


def inplace_floor(traffic, device, steps, warmup, floor_bin):
    """Best time of an in-place stream of the bytes a step moves, pass by pass (`traffic`:
    fusedopt's stats()["traffic"]). On the CPU, fusedopt-bench's own floor (bench/floor.hpp,
    all roles of a pass in one OpenMP loop), by fusedopt-floor (cpu_floor). On a GPU, torch
    operations: each read-only role summed, each updated role
    incremented in place, each write-only role filled. Buffers are shared by the passes (the
    largest each slot needs), 4-byte words of each role's size (4-bit codes: half a byte)."""
    if device == "cpu":
        return cpu_floor(traffic, max(steps, 3), floor_bin)
    sizes = {}
    for p in traffic:
        for kind in ("read_bits", "update_bits", "write_bits"):
            for k, bits in enumerate(p[kind]):
                n = max(1, (p["elements"] * bits + 31) // 32)
                sizes[(kind, k)] = max(sizes.get((kind, k), 0), n)
    bufs = {key: torch.ones(n, dtype=torch.float32, device=device) for key, n in sizes.items()}
    plan = []
    for p in traffic:
        views = {}
        for kind in ("read_bits", "update_bits", "write_bits"):
            views[kind] = [bufs[(kind, k)][:max(1, (p["elements"] * bits + 31) // 32)]
                           for k, bits in enumerate(p[kind])]
        plan.append(views)

    def run():
        for views in plan:
            for r in views["read_bits"]:
                r.sum()
            for u in views["update_bits"]:
                u.add_(1)
            for w in views["write_bits"]:
                w.fill_(1)
    return seconds(run, device, steps, warmup, best=True)


def traffic_bytes(traffic):
    """Bytes one step moves by its traffic (an updated role twice): its bytes_per_step."""
    total = 0
    for p in traffic:
        bits = sum(p["read_bits"]) + 2 * sum(p["update_bits"]) + sum(p["write_bits"])
        total += p["elements"] * bits // 8
    return total


def floors_of(optimizer, device, args):
    """(in-place floor, copy, bytes) for fusedopt optimizer `optimizer`'s step (one step is
    taken first: its kernels are bound at the first)."""
    optimizer.step()
    traffic = [p for stats in optimizer.stats() for p in stats["traffic"]]
    if not traffic:
        sys.exit("fusedopt's optimizer reports no traffic after a step: no floor to measure")
    nbytes = traffic_bytes(traffic)
    return (inplace_floor(traffic, device, args.steps, args.warmup, args.floor_bin),
            copy_floor(nbytes, device, args.steps, args.warmup), nbytes)


def params_of(shapes, device, dtype=torch.float32):
    ps = [torch.randn(s, device=device, dtype=dtype).requires_grad_() for s in shapes]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    return ps


def torch_lamb(params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01,
               max_grad_norm=1.0):
    """apex FusedLAMB's algorithm in torch foreach operations (fusedopt's lamb preset)."""
    state = {"m": [torch.zeros_like(p) for p in params],
             "v": [torch.zeros_like(p) for p in params], "t": 0}

    @torch.no_grad()
    def step():
        state["t"] += 1
        t = state["t"]
        grads = [p.grad for p in params]
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        clip = min(1.0, max_grad_norm / (norm.item() + 1e-6))  # one sync, as apex's reads
        m, v = state["m"], state["v"]
        g = torch._foreach_mul(grads, clip)
        torch._foreach_mul_(m, beta1)
        torch._foreach_add_(m, g, alpha=1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, g, g, 1 - beta2)
        denom = torch._foreach_sqrt(torch._foreach_div(v, 1 - beta2 ** t))
        torch._foreach_add_(denom, eps)
        u = torch._foreach_div(torch._foreach_div(m, 1 - beta1 ** t), denom)
        torch._foreach_add_(u, params, alpha=weight_decay)
        pn = torch.stack(torch._foreach_norm(params))
        un = torch.stack(torch._foreach_norm(u))
        ratio = torch.where((pn > 0) & (un > 0), pn / un, torch.ones_like(pn))
        torch._foreach_mul_(u, (ratio * -lr).tolist())
        torch._foreach_add_(params, u)

    class Lamb:
        pass
    opt = Lamb()
    opt.step = step
    return opt


def case_adamw(name, shapes, args, results):
    device = args.device
    elements = sum(torch.Size(s).numel() for s in shapes)
    floor = None  # fusedopt's optimizer comes first: its step's traffic is the floor's
    makers = [("fusedopt.torch adamw", lambda ps: ft.Optimizer(ps, rule="adamw", lr=1e-3)),
              ("torch AdamW foreach=True",
               lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True)),
              ("torch AdamW foreach=False",
               lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False))]
    if device == "cuda":
        makers.append(("torch AdamW fused=True",
                       lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)))
    for label, make in makers:
        if "foreach=False" in label and len(shapes) > 1000 and device == "cuda":
            continue  # 5,000 launches a step: minutes, and not a contender
        ps = params_of(shapes, device)
        opt = make(ps)
        if floor is None:
            floor, copy, nbytes = floors_of(opt, device, args)
        s = seconds(opt.step, device, args.steps, args.warmup)
        results.append({"case": name, "what": label, "seconds": s, "floor_seconds": floor,
                        "copy_seconds": copy, "bytes": nbytes, "tensors": len(shapes),
                        "elements": elements})
        del opt, ps


def case_amp(args, results):
    if args.device != "cuda":
        return
    shapes = bert_base_shapes()
    elements = sum(torch.Size(s).numel() for s in shapes)
    scaler_cls = torch.amp.GradScaler
    # bytes: ours fp16 p r+w (4), fp16 g r (2) twice (norm pass, update), fp32 master r+w (8),
    # m, v r+w (16): 32 B/element (the floor streams them: fusedopt's stats' traffic)
    floor = []

    def ours_step_factory():
        ps = params_of(shapes, "cuda", torch.float16)
        opt = ft.Optimizer(ps, rule="adamw", lr=1e-3, master_weights=True, max_grad_norm=1.0)
        floor.extend(floors_of(opt, "cuda", args))
        scaler = scaler_cls("cuda", init_scale=1024.0)
        scaler.scale(torch.ones((), device="cuda"))  # the scale exists from here on
        grads = [p.grad.clone() * 1024 for p in ps]

        def step():
            for p, g in zip(ps, grads):
                p.grad = g
            scaler.step(opt)
            scaler.update()
        return step

    def torch_step_factory():
        ps = params_of(shapes, "cuda", torch.float32)
        opt = torch.optim.AdamW(ps, lr=1e-3, fused=True)
        scaler = scaler_cls("cuda", init_scale=1024.0)
        scaler.scale(torch.ones((), device="cuda"))
        grads = [p.grad.clone() * 1024 for p in ps]

        def step():
            # unscale_ divides the grads in place: they shrink step by step, which costs
            # nothing on a GPU (no copy is timed, as none is on fusedopt's side)
            for p, g in zip(ps, grads):
                p.grad = g
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(ps, 1.0)
            scaler.step(opt)
            scaler.update()
        return step

    for label, factory in (("fusedopt fp16+master, clip, GradScaler", ours_step_factory),
                           ("torch fp32: unscale_ + clip_grad_norm_ + fused AdamW",
                            torch_step_factory)):
        step = factory()
        s = seconds(step, "cuda", args.steps, args.warmup)
        results.append({"case": "amp", "what": label, "seconds": s, "floor_seconds": floor[0],
                        "copy_seconds": floor[1], "bytes": floor[2], "tensors": len(shapes),
                        "elements": elements})
        del step


def case_lamb(args, results):
    shapes = bert_base_shapes()
    elements = sum(torch.Size(s).numel() for s in shapes)
    floor = None  # fusedopt's first: its step's traffic is the floor's
    for label, make in (("fusedopt lamb", lambda ps: ft.Optimizer(ps, rule="lamb", lr=1e-3)),
                        ("torch foreach LAMB", torch_lamb)):
        ps = params_of(shapes, args.device)
        opt = make(ps)
        if floor is None:
            floor, copy, nbytes = floors_of(opt, args.device, args)
        s = seconds(opt.step, args.device, args.steps, args.warmup)
        results.append({"case": "lamb", "what": label, "seconds": s, "floor_seconds": floor,
                        "copy_seconds": copy, "bytes": nbytes, "tensors": len(shapes),
                        "elements": elements})
        del opt, ps


def gpt2_matrix_shapes():
    """GPT-2 small's hidden matrices (Conv1D's [in, out]): 48, 84.9 M elements."""
    h = 768
    return [(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)] * 12


MUON_HYPERS = {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "ns_steps": 5, "eps": 1e-7}


def torch_gemm_floor(shapes, steps, runs=2):
    """Seconds of the Newton-Schulz iteration's GEMMs alone in torch fp32 (torch.mm: X X^T,
    A A, B X per round, m the smaller side), each shape's best of `runs` times its matrices
    and rounds."""
    count = {}
    for r, c in shapes:
        key = (min(r, c), max(r, c))
        count[key] = count.get(key, 0) + 1
    total = 0.0
    for (m, n), k in count.items():
        x = torch.randn(m, n) / n ** 0.5
        a = torch.randn(m, m) / m
        best = float("inf")
        for _ in range(runs + 1):
            t0 = time.perf_counter()
            g = x @ x.T
            b = torch.addmm(g, a, a, beta=-4.7750, alpha=2.0315)
            torch.addmm(x, b, x, beta=3.4445)
            best = min(best, time.perf_counter() - t0)
        total += best * k * steps
    return total


def case_muon(args, results):
    if args.device != "cpu":
        print("  muon: CPU only here (fusedopt's matrix stage runs on the host BLAS)",
              flush=True)
        return
    shapes = gpt2_matrix_shapes()
    elements = sum(r * c for r, c in shapes)
    floor = torch_gemm_floor(shapes, MUON_HYPERS["ns_steps"])
    # The rule's hyper names (fusedopt's muon preset): nesterov 1, adjust_lr_fn 0 "original".
    ours = dict(MUON_HYPERS, nesterov=1.0, ns_a=3.4445, ns_b=-4.7750, ns_c=2.0315,
                adjust_lr_fn=0)
    makers = [("fusedopt.torch muon, fp32 iteration",
               lambda ps: ft.Optimizer(ps, "muon", **ours)),
              ("fusedopt.torch muon, bf16 iteration",
               lambda ps: ft.Optimizer(ps, "muon", matrix_precision="bf16", **ours))]
    if hasattr(torch.optim, "Muon"):
        makers.append(("torch.optim.Muon (bf16 iteration)",
                       lambda ps: torch.optim.Muon(ps, nesterov=True, **MUON_HYPERS)))
    else:
        print(f"  muon: torch {torch.__version__} has no torch.optim.Muon (torch 2.9+): "
              "fusedopt's side alone", flush=True)
    for label, make in makers:
        torch.manual_seed(0)
        ps = params_of(shapes, "cpu")
        try:
            opt = make(ps)
        except (TypeError, ValueError, RuntimeError, fusedopt.Error) as e:
            print(f"  muon: {label}: not measured ({type(e).__name__}: "
                  f"{str(e).splitlines()[0]})", flush=True)
            continue
        s = seconds(opt.step, "cpu", args.steps, args.warmup)
        results.append({"case": "muon", "what": label, "seconds": s,
                        "gemm_floor_seconds": floor, "tensors": len(shapes),
                        "elements": elements})
        del opt, ps
    ref = [r for r in results if r["what"].startswith("torch.optim.Muon")]
    for r in results:
        if ref and r["what"].startswith("fusedopt"):
            r["speedup"] = ref[0]["seconds"] / r["seconds"]


PROBE = """
import sys, time, torch, fusedopt.torch as ft
p = torch.randn(1000, device=sys.argv[1], requires_grad=True); p.grad = torch.ones_like(p)
t0 = time.perf_counter()
o = ft.Optimizer([p], rule=sys.argv[2]); o.step()
if sys.argv[1] == "cuda": torch.cuda.synchronize()
print(time.perf_counter() - t0, o.stats()[0]["kernel_origin"])
"""


def case_compile(args, results):
    rule = "param p\ngrad g\nstate m = 0\nhyper lr = 0.1, beta = 0.9, salt = %d\n" \
           "m = beta * m + g\np = p - lr * m\n" % random.SystemRandom().randrange(10 ** 9)
    env = dict(os.environ, FUSEDOPT_CACHE_DIR=tempfile.mkdtemp(prefix="fusedopt-bench-"))
    for label in ("cold compile (empty cache)", "disk hit (fresh process)"):
        out = subprocess.run([sys.executable, "-c", PROBE, args.device, rule], env=env,
                             check=True, capture_output=True, text=True).stdout.split()
        results.append({"case": "compile", "what": f"{label}: {out[1]}",
                        "seconds": float(out[0])})
    p = torch.randn(1000, device=args.device, requires_grad=True)
    p.grad = torch.ones_like(p)
    ft.Optimizer([p], rule="adamw").step()
    t0 = time.perf_counter()
    o = ft.Optimizer([p], rule="adamw")
    o.step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    results.append({"case": "compile",
                    "what": f"memory hit (same process): {o.stats()[0]['kernel_origin']}",
                    "seconds": time.perf_counter() - t0})


def case_overhead(args, results):
    device = args.device
    for n in (100, 1000, 10000, 50000):
        ps = params_of([(16,)] * n, device)
        opt = ft.Optimizer(ps, rule="adamw", lr=1e-3)
        opt.step()  # plans and binds: the timed steps are steady
        engine = opt._engines[0].engine  # the C++ optimizer the step drives (private)
        stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
        py = seconds(opt.step, device, args.steps, args.warmup)
        cpp = seconds(lambda: engine.step(stream), device, args.steps, args.warmup)
        line = {"case": "overhead", "tensors": n, "elements": 16 * n}
        results.append(dict(line, what=f"fusedopt.torch adamw, {n} tensors", seconds=py,
                            cpp_seconds=cpp))
        del opt, engine
        fused = device == "cuda" or tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 4)
        for label, kw in [("foreach=True", {"foreach": True})] + \
                [("fused=True", {"fused": True})] * fused:
            ref = torch.optim.AdamW(ps, lr=1e-3, **kw)
            results.append(dict(line, what=f"torch AdamW {label}, {n} tensors",
                                seconds=seconds(ref.step, device, args.steps, args.warmup)))
            del ref
        del ps


def plot(json_path, png_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(json_path) as f:
        data = json.load(f)
    # fusedopt-bench --json writes the same schema (no torch; 0 where no floor was measured).
    rows = [r for r in data["results"] if r.get("floor_seconds") and r.get("seconds")]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    labels = [f"{r['case']}: {r['what']}" for r in rows]
    ax.barh(labels, [r["seconds"] * 1e3 for r in rows])
    for i, r in enumerate(rows):
        ax.text(r["seconds"] * 1e3, i, f" {r['floor_seconds'] / r['seconds']:.2f} of floor",
                va="center")
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (median)")
    m = data["machine"]
    torch_part = f", torch {m['torch']}" if m.get("torch") else ""
    ax.set_title(f"{m['device']}{torch_part}, fusedopt {m['fusedopt']}, {m['date']}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cases", default="adamw,small,amp,lamb,compile,overhead")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch's CPU threads (default: every core, as fusedopt's OpenMP "
                         "kernel uses)")
    build = os.environ.get("FUSEDOPT_BUILD_DIR", "build")
    ap.add_argument("--floor-bin",
                    default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", build,
                                         "bench", "fusedopt-floor"),
                    help="fusedopt-floor, the CPU floor (default: BUILD/bench/fusedopt-floor, "
                         "BUILD being $FUSEDOPT_BUILD_DIR or build)")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"),
                    help="draw a results file instead of measuring")
    args = ap.parse_args()
    if args.plot:
        plot(*args.plot)
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    machine = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else cpu_name(),
        "driver": driver_version() if args.device == "cuda" else "",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "fusedopt": fusedopt.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"device {args.device} ({machine['device']}, {machine['threads']} threads), "
          f"torch {machine['torch']}, fusedopt {machine['fusedopt']}, {machine['date']}",
          flush=True)
    runs = {"adamw": lambda res: case_adamw("adamw", bert_base_shapes(), args, res),
            "small": lambda res: case_adamw("small", small_shapes(), args, res),
            "amp": lambda res: case_amp(args, res),
            "lamb": lambda res: case_lamb(args, res),
            "compile": lambda res: case_compile(args, res),
            "overhead": lambda res: case_overhead(args, res),
            "muon": lambda res: case_muon(args, res)}
    results = []
    # Each case's lines as it ends, and the JSON rewritten after each: a run cut short (the
    # device tool's time limit) keeps what it measured.
    for case in args.cases.split(","):
        if case not in runs:
            sys.exit(f"unknown case {case!r}; the cases: {', '.join(runs)}")
        new = []
        runs[case](new)
        results += new
        for r in new:
            if "floor_seconds" in r:
                floor = r["floor_seconds"]
                print(f"  {r['case']:7s} {r['what']:52s} {r['seconds'] * 1e3:9.2f} ms  "
                      f"{floor / r['seconds']:.2f} of the floor ({floor * 1e3:.2f} ms, "
                      f"{r['bytes'] / floor / 1e9:.0f} GB/s; copy {r['copy_seconds'] * 1e3:.2f} "
                      f"ms; {r['tensors']} tensors)", flush=True)
            elif "gemm_floor_seconds" in r:
                floor = r["gemm_floor_seconds"]
                speedup = f"; {r['speedup']:.2f}x torch.optim.Muon" if "speedup" in r else ""
                print(f"  {r['case']:7s} {r['what']:52s} {r['seconds'] * 1e3:9.2f} ms  "
                      f"torch's fp32 GEMMs alone {floor * 1e3:.2f} ms "
                      f"({floor / r['seconds']:.2f} of the step){speedup}", flush=True)
            elif "cpp_seconds" in r:
                extra = (r["seconds"] - r["cpp_seconds"]) / r["tensors"]
                print(f"  {r['case']:7s} {r['what']:52s} {r['seconds'] * 1e3:9.2f} ms  "
                      f"(C++ step {r['cpp_seconds'] * 1e3:.2f} ms: {extra * 1e9:.0f} ns per "
                      "tensor from Python)", flush=True)
            else:
                print(f"  {r['case']:7s} {r['what']:52s} {r['seconds'] * 1e3:9.2f} ms",
                      flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": machine, "results": results}, f, indent=2)

if __name__ == "__main__":
    main()
