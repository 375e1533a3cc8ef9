#!/usr/bin/env python3
"""Reads an Optimizer checkpoint with the Python safetensors package.

Runs examples/train_user_rule, which trains a linear model with a user rule and saves its
optimizer, then checks the file as a PyTorch user would see it: one tensor per
(parameter, state) pair with the right shapes and dtype, finite values, the EMA state
close to the weights the program printed, and the metadata (rule, step, hypers).
Usage: check_checkpoint.py TRAIN_USER_RULE_EXE WORK_DIR
"""
import os
import re
import subprocess
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def main() -> int:
    exe, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "optimizer.safetensors")
    env = dict(os.environ, FUSEDOPT_CACHE="memory")
    out = subprocess.run([exe, path], check=True, capture_output=True, text=True, env=env).stdout
    w0, w1 = (float(x) for x in re.search(r"w = (\S+) (\S+)", out).groups())

    tensors = load_file(path)
    expected = {"w/velocity": (32,), "w/average": (32,), "b/velocity": (1,), "b/average": (1,)}
    failures = []
    if set(tensors) != set(expected):
        failures.append(f"tensor names {sorted(tensors)} != {sorted(expected)}")
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is None:
            continue
        if t.shape != shape or t.dtype != np.float32:
            failures.append(f"{name}: shape {t.shape} dtype {t.dtype}, want {shape} float32")
        if not np.all(np.isfinite(t)):
            failures.append(f"{name}: non-finite values")
    # The average starts at w = 0 and, with ema = 0.99 over 201 steps, still carries
    # 0.99^201 (13%) of that start: it lies between 0 and the converged weights, near 0.87 w.
    avg = tensors["w/average"]
    for a, w in ((avg[0], w0), (avg[1], w1)):
        if not 0.75 * abs(w) < abs(a) < abs(w) or np.sign(a) != np.sign(w):
            failures.append(f"w/average starts {avg[:2]}, weights are {w0} {w1}")
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata()
    if meta.get("rule") != "momentum_ema":
        failures.append(f"metadata rule = {meta.get('rule')!r}")
    if meta.get("step") != "201":
        failures.append(f"metadata step = {meta.get('step')!r}")
    if "lr=" not in meta.get("hypers", ""):
        failures.append(f"metadata hypers = {meta.get('hypers')!r}")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"ok: {len(tensors)} tensors, metadata {sorted(meta)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
