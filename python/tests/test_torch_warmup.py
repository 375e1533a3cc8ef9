"""The kernel cache seen from Python (fusedopt.warmup, the fusedopt-cache CLI filling the cache a
fresh process reads) and the examples that train with fusedopt.torch.
"""
import os

import pytest
import torch

import fusedopt
import fusedopt.torch as ft


def test_warmup_fills_the_cache_the_first_step_uses(cache_dir):
    p = torch.randn(12, requires_grad=True)
    # A rule no other test compiles (its text is part of the kernel's key).
    rule = "param p\ngrad g\nstate m = 0\nhyper lr = 0.1, warmup_test = 1\nm = m + g\n" \
           "p = p - lr * warmup_test * m\n"
    first = fusedopt.warmup(rule, params=[p])
    assert [k["origin"] for k in first] == ["compiled"]
    assert fusedopt.warmup(rule, targets=["host"], dtypes=["fp32"])[0]["origin"] in (
        "memory", "disk")
    opt = ft.Optimizer([p], rule=rule)
    p.grad = torch.ones(12)
    opt.step()
    assert opt.stats()[0]["kernel_origin"] in ("memory", "disk")
    assert opt.stats()[0]["kernel_keys"] == [first[0]["key"]]


@pytest.mark.parametrize("preset", ["adamw8bit", "adamw4bit+sr", "lion8bit", "adamw"])
def test_warmup_compiles_every_kernel_the_first_step_loads(cache_dir, preset):
    # A big param steps in the preset's quantized binding, a small one (below
    # quant_min_numel) in the plain one: warmup must compile both.
    params = [torch.randn(64, 128, requires_grad=True), torch.randn(10, requires_grad=True)]
    warmed = {k["key"] for k in fusedopt.warmup(preset, params=params)}
    opt = ft.Optimizer(params, rule=preset)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    loaded = {key for engine in opt.stats() for key in engine["kernel_keys"]}
    assert loaded <= warmed, f"{preset}: the step loaded {loaded - warmed}, never warmed"
    assert len(warmed) == (1 if preset == "adamw" else 2)


CLI = os.environ.get("FUSEDOPT_CACHE_CLI", "")


@pytest.mark.skipif(not os.path.exists(CLI), reason="no fusedopt-cache binary: set "
                    "FUSEDOPT_CACHE_CLI (scripts/test-python sets it to the build's)")
def test_the_cli_warms_the_cache_a_fresh_process_reads(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, FUSEDOPT_CACHE_DIR=str(tmp_path))
    subprocess.run([CLI, "warmup", "--preset", "lion", "--target", "host"], env=env,
                   check=True, capture_output=True)
    probe = ("import torch, fusedopt.torch as ft\n"
             "p = torch.randn(10, requires_grad=True); p.grad = torch.ones(10)\n"
             "o = ft.Optimizer([p], rule='lion'); o.step()\n"
             "print(o.stats()[0]['kernel_origin'])\n")
    out = subprocess.run([sys.executable, "-c", probe], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out[-1] == "disk"  # the CLI's kernel, no compile


def test_the_example_trains():
    import subprocess
    import sys
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_mlp.py")
    out = subprocess.run([sys.executable, example, "--device", "cpu", "--steps", "60"],
                         check=True, capture_output=True, text=True).stdout
    for line in out.strip().splitlines():
        first, last = (float(v) for v in line.split("loss ")[1].split(" in ")[0].split(" -> "))
        assert last < 0.5 * first, line


def test_the_quickstart_runs(tmp_path):
    # examples/torch_quickstart.py is the README's PyTorch example (scripts/check-docs).
    import subprocess
    import sys
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                           "torch_quickstart.py")
    out = subprocess.run([sys.executable, os.path.abspath(example)], cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout
    assert "1 launch per step instead of 2" in out, out
    state = torch.load(tmp_path / "opt.pt")
    assert sorted(state["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]
    assert float(out.split("loss ")[-1].split()[0]) < 1.0, out  # from about 57
    # The scheduler moved with the optimizer: StepLR halved lr at steps 10, 20 and 30.
    assert "lr after the move: 0.00125" in out, out
