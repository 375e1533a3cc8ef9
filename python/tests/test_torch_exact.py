"""The option exact of the presets sgd, adam and adamw: the operation order of torch 1.13's
CPU for-loop path (foreach=False), so that fp32 params and states are bit-identical to it after
100 steps on fresh random data. torch >= 2 computes Adam's exp_avg with lerp_ (the presets'
default form), so the comparison needs the torch these tests run against in CI, 1.13.
"""
import pytest
import torch

import fusedopt.torch as ft
from test_torch_optimizer import make_params, twin

TORCH_113 = torch.__version__.startswith("1.13")

EXACT = [
    ("sgd", torch.optim.SGD, dict(lr=0.1)),
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.8, maximize=True)),
    ("adam", torch.optim.Adam, dict(lr=1e-2)),
    ("adam", torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, maximize=True)),
    ("adamw", torch.optim.AdamW, dict(lr=1e-2)),
    ("adamw", torch.optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
]


def run(preset, cls, kw, exact, steps=100):
    ps = make_params()
    qs = twin(ps)
    ours = ft.Optimizer(ps, rule=preset, exact=exact, **kw)
    theirs = cls(qs, foreach=False, **kw)
    for _ in range(steps):
        for p, q in zip(ps, qs):
            g = torch.randn_like(p)
            p.grad, q.grad = g, g.clone()
        ours.step()
        theirs.step()
    return ps, qs, ours, theirs


@pytest.mark.skipif(not TORCH_113, reason=f"the exact presets follow torch 1.13's order; this is "
                                          f"torch {torch.__version__}")
@pytest.mark.parametrize("preset,cls,kw", EXACT, ids=lambda c: str(c))
def test_exact_preset_is_bit_identical_to_torch_113_after_100_steps(seed, preset, cls, kw):
    ps, qs, ours, theirs = run(preset, cls, kw, exact=True)
    # sgd's default form is torch's order already: its option exact is the same rule.
    assert ours.rule.name == (preset if preset == "sgd" else preset + "+exact")
    for i, (p, q) in enumerate(zip(ps, qs)):
        assert torch.equal(p, q), f"param {i}: {(p != q).sum().item()} elements differ"
        for name, t in theirs.state[q].items():
            if isinstance(t, torch.Tensor) and name != "step":
                assert torch.equal(ours.state[p][name], t), f"param {i}: state {name} differs"


@pytest.mark.skipif(not TORCH_113, reason=f"the exact presets follow torch 1.13's order; this is "
                                          f"torch {torch.__version__}")
def test_the_default_adamw_is_not_bit_identical_to_torch_113():
    # What the option changes: without it, the lerp form of torch >= 2 (within fp32 rounding
    # of torch 1.13, not equal to it).
    ps, qs, _, _ = run("adamw", torch.optim.AdamW, dict(lr=1e-2), exact=False, steps=10)
    assert any(not torch.equal(p, q) for p, q in zip(ps, qs))
    for p, q in zip(ps, qs):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)


def test_exact_is_an_option_of_sgd_adam_and_adamw_only():
    p = torch.randn(3, requires_grad=True)
    with pytest.raises(Exception, match="has no hyper 'exact'|unknown preset"):
        ft.Optimizer([p], rule="rmsprop", exact=True)
    with pytest.raises(Exception, match="unknown preset 'adamw\\+amsgrad\\+exact'"):
        ft.Optimizer([p], rule="adamw", exact=True, amsgrad=True)
