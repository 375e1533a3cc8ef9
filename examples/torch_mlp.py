#!/usr/bin/env python3
"""Training a small MLP with fusedopt from PyTorch: the preset AdamW fused into one kernel,
a rule written here (AdaBelief), and an LR scheduler driving both, on synthetic data.
The rest of the training loop is plain PyTorch.

  python3 examples/torch_mlp.py [--device cpu|cuda] [--steps N]
"""
import argparse

import torch

import fusedopt.torch as ft

# docs:begin adabelief
# AdaBelief (Zhuang et al., 2020) in fusedopt's rule language: Adam whose second moment
# tracks the gradient's deviation from its running mean.
ADABELIEF = """
param p
grad  g
state m = 0, s = 0
hyper lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-16, weight_decay = 0
p = p * (1 - lr * weight_decay)
m = lerp(m, g, 1 - beta1)
s = beta2 * s + (1 - beta2) * (g - m) * (g - m) + eps
p = p - lr * (m / (1 - beta1 ^ step)) / (sqrt(s / (1 - beta2 ^ step)) + eps)
"""
# docs:end adabelief


def train(rule, device, steps, **hypers):
    torch.manual_seed(0)
    x = torch.randn(256, 32, device=device)
    y = torch.sin(x @ torch.randn(32, 1, device=device))  # a target to fit
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 1)).to(device)
    opt = ft.Optimizer(model.parameters(), rule=rule, **hypers)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()  # one fused launch over every parameter
        sched.step()  # changes group["lr"]; the next step uses it, nothing recompiles
        losses.append(loss.item())
    return losses, opt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    for name, rule, hypers in (("adamw (preset)", "adamw", dict(lr=3e-3, weight_decay=1e-2)),
                               ("adabelief (rule)", ADABELIEF, dict(lr=3e-3))):
        losses, opt = train(rule, args.device, args.steps, **hypers)
        print(f"{name:18s} loss {losses[0]:.4f} -> {losses[-1]:.4f} in {args.steps} steps; "
              f"{opt.stats()[0]['fusion_report']}")


if __name__ == "__main__":
    main()
