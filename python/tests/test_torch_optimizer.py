"""fusedopt.torch.Optimizer against torch.optim on the CPU: every preset with a torch
counterpart after 100 steps on the same fresh random data (params and every state), the
state_dict round trip torch -> fusedopt -> torch, LR schedulers without recompiles, params
without gradients, param groups added later, the AMP protocol, clipping, mixed precision and
a rule of the user's. Its helpers (make_params, twin, close, feed, compare_states,
run_against_torch) serve the other test_torch_*.py files too; bad input, live states,
load_state_dict and the cache have files of their own.

Tolerance: |fusedopt - torch| <= 1e-5 * (|torch| + max|torch|) per tensor, params and states.
Both sides compute in fp32 with the same formulas; what differs is rounding (fusedopt folds
hyper-only subexpressions in double and rounds once, torch in Python floats), which stays
near 1e-6 over 100 steps.
"""
import copy
import math
import os

import pytest
import torch

import fusedopt
import fusedopt.torch as ft

TORCH_2 = int(torch.__version__.split(".")[0]) >= 2
RTOL = 1e-5

# A param list with what shapes do to a fused kernel: a matrix, a vector, a 3-D tensor, an
# empty one and one of a prime size past the vector width.
SHAPES = [(37, 53), (101,), (3, 4, 5), (0,), (1031,)]

CASES = [
    ("sgd", torch.optim.SGD, dict(lr=0.1)),
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True)),
    ("adam", torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1)),
    ("adam", torch.optim.Adam, dict(lr=1e-2, amsgrad=True, maximize=True)),
    ("adamw", torch.optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6)),
    ("adamw", torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
    ("adagrad", torch.optim.Adagrad,
     dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
    ("rmsprop", torch.optim.RMSprop, dict(lr=1e-2)),
    ("rmsprop", torch.optim.RMSprop,
     dict(lr=1e-2, momentum=0.9, centered=True, weight_decay=0.1)),
    ("adamax", torch.optim.Adamax, dict(lr=1e-2, weight_decay=0.1)),
    ("radam", torch.optim.RAdam, dict(lr=1e-2, weight_decay=0.1)),
    ("adadelta", torch.optim.Adadelta, dict(lr=1.0, rho=0.8, weight_decay=0.1)),
    ("rprop", torch.optim.Rprop, dict(lr=1e-2, etas=(0.4, 1.3), step_sizes=(1e-5, 10))),
    ("asgd", torch.optim.ASGD, dict(lr=1e-2, t0=20, lambd=1e-3, weight_decay=0.1)),
]
if TORCH_2:  # torch 1.13's NAdam multiplies mu twice into mu_product_next (fixed in 2.0)
    CASES.append(("nadam", torch.optim.NAdam, dict(lr=1e-2, weight_decay=0.1)))
if hasattr(torch.optim, "Adafactor"):  # torch >= 2.5
    CASES.append(("adafactor", torch.optim.Adafactor, dict(lr=1e-2)))


def make_params(shapes=SHAPES, dtype=torch.float32):
    return [torch.randn(s, dtype=dtype).requires_grad_() for s in shapes]


def twin(params):
    return [p.detach().clone().requires_grad_() for p in params]


def close(got, want, what, rtol=RTOL, scale=None):
    """Relative to the tensor's own largest magnitude, or to `scale` where a tensor's values
    may all sit near zero (a one-element bias after training: its magnitude says nothing
    about the rounding differences the training accumulated)."""
    got = got.detach().double().reshape(want.shape)
    want = want.detach().double()
    if want.numel() == 0:
        return
    scale = want.abs().max() if scale is None else max(float(scale), want.abs().max().item())
    err = ((got - want).abs() / (want.abs() + scale + 1e-30)).max().item()
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol}"


def feed(*param_lists):
    """The same fresh gradient into each list's params."""
    for group in zip(*param_lists):
        g = torch.randn_like(group[0])
        for p in group:
            p.grad = g.clone()


def compare_states(ours, theirs, rtol=RTOL):
    """Every state torch keeps, by torch's names, step included."""
    a, b = ours.state_dict()["state"], theirs.state_dict()["state"]
    assert set(b) <= set(a), f"states of params {sorted(set(b) - set(a))} missing"
    for i, entry in b.items():
        for key, value in entry.items():
            if value is None:
                continue
            assert key in a[i], f"param {i}: no state '{key}' (has {sorted(a[i])})"
            if key == "step":
                assert float(a[i][key]) == float(value), f"param {i}: step"
            else:
                close(a[i][key], value, f"param {i} state {key}", rtol)


def run_against_torch(preset, cls, kw, ps, steps=100):
    """`steps` steps of the preset and of torch's class on twins of `ps`, the same fresh
    gradients each step; then every param and state compared."""
    qs = twin(ps)
    ours = ft.Optimizer(ps, rule=preset, **kw)
    theirs = cls(qs, **kw)
    for _ in range(steps):
        feed(ps, qs)
        ours.step()
        theirs.step()
    for i, (p, q) in enumerate(zip(ps, qs)):
        close(p.cpu(), q.cpu(), f"param {i}")
    compare_states(ours, theirs)
    return ours


@pytest.mark.parametrize("preset,cls,kw", CASES, ids=lambda c: str(c))
def test_preset_matches_torch_after_100_steps(seed, preset, cls, kw):
    shapes = SHAPES
    if preset == "adafactor":  # torch's Adafactor divides by an empty tensor's 0 elements
        shapes = [s for s in SHAPES if 0 not in s]
    ours = run_against_torch(preset, cls, kw, make_params(shapes))
    assert ours.engine_builds == 1


def nadam_reference(p, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                    momentum_decay=4e-3):
    """torch >= 2.0's single-tensor NAdam in float64, written out."""
    p = p.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    mu_product = 1.0
    for t, g in enumerate(grads, start=1):
        g = g.double() + weight_decay * p
        mu = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
        mu_next = beta1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
        mu_product *= mu
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        denom = (v / (1 - beta2 ** t)).sqrt() + eps
        p = p - lr * (1 - mu) / (1 - mu_product) * g / denom
        p = p - lr * mu_next / (1 - mu_product * mu_next) * m / denom
    return p, m, v, mu_product


def test_nadam_matches_a_float64_reference(seed):
    # torch 1.13's NAdam has a known bug (mu_product_next = mu_product * mu * mu_next),
    # so here the reference is torch >= 2.0's formula in float64.
    ps = make_params([(37, 53), (101,)])
    start = [p.detach().clone() for p in ps]
    grads = [[torch.randn_like(p) for _ in range(100)] for p in ps]
    ours = ft.Optimizer(ps, rule="nadam", lr=1e-2, weight_decay=0.1)
    for t in range(100):
        for p, g in zip(ps, grads):
            p.grad = g[t]
        ours.step()
    for i, (p, p0, g) in enumerate(zip(ps, start, grads)):
        want, m, v, mu_product = nadam_reference(p0, g, 1e-2, weight_decay=0.1)
        close(p, want, f"param {i}")
        state = ours.state[p]
        close(state["exp_avg"], m, "exp_avg")
        close(state["exp_avg_sq"], v, "exp_avg_sq")
        assert math.isclose(state["mu_product"].item(), mu_product, rel_tol=1e-12)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_real_model_trains_the_same(seed, set_to_none):
    # An MLP on synthetic data: backward fills the grads; zero_grad(set_to_none=True) frees
    # them, so every step's gradients are new tensors (rebound, not re-planned), while
    # set_to_none=False zeroes them in place.
    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 1))
    a = mlp()
    b = mlp()
    b.load_state_dict(a.state_dict())
    ours = ft.Optimizer(a.parameters(), rule="adamw", lr=1e-2)
    theirs = torch.optim.AdamW(b.parameters(), lr=1e-2)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for _ in range(50):
        for model, opt in ((a, ours), (b, theirs)):
            opt.zero_grad(set_to_none=set_to_none)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    # 50 steps of training amplify the last-bit differences of the two implementations
    # (torch's own for-loop and foreach paths differ too): each tensor is compared at the
    # model's scale, not at its own (a bias may end near zero).
    model_scale = max(q.detach().abs().max().item() for q in b.parameters())
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        close(p, q, name, scale=model_scale)
    assert ours.engine_builds == 1


def test_state_dict_round_trip_torch_fusedopt_torch(seed):
    ps = make_params()
    qs = twin(ps)
    rs = twin(ps)
    theirs = torch.optim.AdamW(qs, lr=1e-2, amsgrad=True, weight_decay=0.05)
    for _ in range(7):
        feed(qs)
        theirs.step()
    with torch.no_grad():
        for p, q in zip(ps, qs):
            p.copy_(q)
    # torch -> fusedopt: from a live optimizer, and from its state_dict.
    ours = ft.from_torch(theirs)
    assert ours.rule.name == "adamw+amsgrad"
    assert [p is q for p, q in zip(ours.param_groups[0]["params"], qs)] == [True] * len(qs)
    compare_states(ours, theirs, rtol=0)
    loaded = ft.Optimizer(ps, rule="adamw")
    with pytest.warns(UserWarning, match="amsgrad=True"):
        loaded.load_state_dict(theirs.state_dict())
    assert loaded.rule.name == "adamw"  # amsgrad comes from the rule, not the checkpoint
    assert loaded.param_groups[0]["amsgrad"] is False
    # The next steps are equal: torch, fusedopt converted live (on torch's own params).
    ours = ft.Optimizer(ps, rule="adamw+amsgrad")
    ours.load_state_dict(theirs.state_dict())
    for _ in range(3):
        feed(ps, qs)
        ours.step()
        theirs.step()
    for p, q in zip(ps, qs):
        close(p, q, "param")
    compare_states(ours, theirs)
    # fusedopt -> torch: a fresh torch optimizer from our state_dict steps as we do.
    with torch.no_grad():
        for r, p in zip(rs, ps):
            r.copy_(p)
    back = torch.optim.AdamW(rs, lr=1.0, amsgrad=True)
    # As through torch.save and torch.load: state_dict() hands out the live states (as torch's
    # does), and torch >= 2's load_state_dict keeps tensors of the right dtype and device
    # without copying, so `back` would step our arena's m and v a second time.
    back.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert back.param_groups[0]["lr"] == 1e-2  # the hypers travel with the groups
    compare_states(ours, back, rtol=0)
    for _ in range(3):
        feed(ps, rs)
        ours.step()
        back.step()
    for p, r in zip(ps, rs):
        close(p, r, "param after fusedopt -> torch")


@pytest.mark.parametrize("cls,kw", [
    (torch.optim.SGD, dict(lr=0.05, momentum=0.9)), (torch.optim.Adam, dict(lr=1e-2)),
    (torch.optim.Adagrad, dict(lr=0.1)), (torch.optim.RMSprop, dict(lr=1e-2, centered=True)),
    (torch.optim.Adamax, dict(lr=1e-2)), (torch.optim.RAdam, dict(lr=1e-2)),
    (torch.optim.Adadelta, dict(lr=1.0)), (torch.optim.Rprop, dict(lr=1e-2)),
    (torch.optim.ASGD, dict(lr=1e-2, t0=3))], ids=lambda c: getattr(c, "__name__", ""))
def test_from_torch_converts_a_live_optimizer(seed, cls, kw):
    ps = make_params()
    qs = twin(ps)
    theirs = cls(qs, **kw)
    for _ in range(5):
        feed(qs)
        theirs.step()
    ours = ft.from_torch(theirs)
    with torch.no_grad():
        for p, q in zip(ps, qs):
            p.copy_(q)
    twin_of_theirs = cls(ps, **kw)
    twin_of_theirs.load_state_dict(theirs.state_dict())
    for _ in range(5):
        feed(qs, ps)
        ours.step()  # steps qs: the converted optimizer owns torch's own params
        twin_of_theirs.step()
    for p, q in zip(ps, qs):
        close(q, p, "param")


def test_from_torch_refuses_what_has_no_preset():
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(fusedopt.UsageError, match="LBFGS has no fusedopt preset"):
        ft.from_torch(torch.optim.LBFGS([p]))
    # A group option the preset cannot follow is named, not dropped.
    opt = torch.optim.SGD([p], lr=0.1)
    opt.param_groups[0]["some_future_flag"] = True
    with pytest.raises(fusedopt.UsageError, match="'some_future_flag'"):
        ft.from_torch(opt)


def test_lr_scheduler_changes_lr_without_recompiling(seed, cache_dir):
    ps = make_params()
    qs = twin(ps)
    groups_ours = [{"params": ps[:2]}, {"params": ps[2:], "lr": 5e-3}]
    groups_theirs = [{"params": qs[:2]}, {"params": qs[2:], "lr": 5e-3}]
    ours = ft.Optimizer(groups_ours, rule="adamw", lr=1e-2)
    theirs = torch.optim.AdamW(groups_theirs, lr=1e-2)
    sched_ours = torch.optim.lr_scheduler.OneCycleLR(ours, max_lr=[0.05, 0.02], total_steps=60)
    sched_theirs = torch.optim.lr_scheduler.OneCycleLR(theirs, max_lr=[0.05, 0.02],
                                                       total_steps=60)
    feed(ps, qs)
    ours.step()
    theirs.step()
    entries = sorted(os.listdir(cache_dir))
    keys = ours.stats()[0]["kernel_keys"]
    lrs = set()
    for _ in range(59):
        sched_ours.step()
        sched_theirs.step()
        feed(ps, qs)
        ours.step()
        theirs.step()
        lrs.add(ours.param_groups[0]["lr"])
    assert len(lrs) > 50  # the schedule moved lr (and beta1, OneCycleLR's momentum) each step
    for p, q in zip(ps, qs):
        close(p, q, "param")
    assert ours.engine_builds == 1
    assert ours.stats()[0]["kernel_keys"] == keys
    assert sorted(os.listdir(cache_dir)) == entries, "the schedule compiled a kernel"


def test_params_without_gradients_are_skipped_as_torch_skips_them(seed):
    # Param 1 has no gradient for the first 3 steps, param 2 never has one: torch keeps no
    # state for them and counts their steps apart; so does fusedopt (an engine per count).
    ps = make_params([(17,), (23,), (5,)])
    qs = twin(ps)
    ours = ft.Optimizer(ps, rule="adam", lr=1e-2)
    theirs = torch.optim.Adam(qs, lr=1e-2)
    for t in range(8):
        for p, q in zip(ps, qs):
            p.grad = q.grad = None
        active = [0] if t < 3 else [0, 1]
        feed([ps[i] for i in active], [qs[i] for i in active])
        ours.step()
        theirs.step()
    for i, (p, q) in enumerate(zip(ps, qs)):
        close(p, q, f"param {i}")
    assert ps[2] not in ours.state or not ours.state[ps[2]]
    compare_states(ours, theirs)
    steps = {i: float(s["step"]) for i, s in ours.state_dict()["state"].items()}
    assert steps == {0: 8.0, 1: 5.0}


def test_a_rule_with_global_reductions_refuses_params_with_different_step_counts():
    ps = make_params([(4,), (5,)])
    ours = ft.Optimizer(ps, rule="lamb")
    ps[0].grad = torch.randn(4)
    ours.step()
    ps[1].grad = torch.randn(5)
    with pytest.raises(fusedopt.UsageError, match="different numbers of steps"):
        ours.step()


def test_add_param_group_plans_again(seed):
    ps = make_params([(10,), (20,)])
    qs = twin(ps)
    ours = ft.Optimizer([ps[0]], rule="sgd", lr=0.1, momentum=0.9)
    theirs = torch.optim.SGD([qs[0]], lr=0.1, momentum=0.9)
    for t in range(6):
        if t == 2:
            ours.add_param_group({"params": [ps[1]], "lr": 0.01})
            theirs.add_param_group({"params": [qs[1]], "lr": 0.01})
        n = 1 if t < 2 else 2
        feed(ps[:n], qs[:n])
        ours.step()
        theirs.step()
    for p, q in zip(ps, qs):
        close(p, q, "param")


def test_grad_scaler_protocol_on_the_cpu(seed):
    # What torch's GradScaler hands a `_step_supports_amp_scaling` optimizer: grad_scale and
    # found_inf as attributes for the step. The kernel divides by the scale; a found inf
    # skips the whole step (params, states and the step count).
    assert ft.Optimizer._step_supports_amp_scaling
    ps = make_params()
    qs = twin(ps)
    ours = ft.Optimizer(ps, rule="adamw", lr=1e-2)
    theirs = torch.optim.AdamW(qs, lr=1e-2)
    scale = torch.tensor(2.0 ** 12)
    for t in range(6):
        feed(ps, qs)
        for p in ps:
            p.grad.mul_(scale)
        skipped = t == 3
        ours.grad_scale = scale
        ours.found_inf = torch.tensor(1.0 if skipped else 0.0)
        before = [p.detach().clone() for p in ps]
        ours.step()
        del ours.grad_scale, ours.found_inf
        if skipped:
            for p, b in zip(ps, before):
                assert torch.equal(p, b)
        else:
            theirs.step()
    for p, q in zip(ps, qs):
        close(p, q, "param")
    compare_states(ours, theirs)  # the skipped step did not count


@pytest.mark.skipif(not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"),
                    reason="torch.amp.GradScaler (CPU) needs torch >= 2.3")
def test_torch_amp_grad_scaler_on_the_cpu(seed):
    ps = make_params([(64,)])
    qs = twin(ps)
    ours = ft.Optimizer(ps, rule="adamw", lr=1e-2)
    theirs = torch.optim.AdamW(qs, lr=1e-2)
    s1 = torch.amp.GradScaler("cpu", init_scale=1024.0)
    s2 = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for t in range(5):
        x = torch.randn(64)
        for scaler, p, opt in ((s1, ps[0], ours), (s2, qs[0], theirs)):
            opt.zero_grad()
            loss = (p * x).sum() * (float("inf") if t == 2 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    close(ps[0], qs[0], "param")
    assert s1.get_scale() == s2.get_scale()


def test_max_grad_norm_clips_like_clip_grad_norm(seed):
    ps = make_params()
    qs = twin(ps)
    ours = ft.Optimizer(ps, rule="adamw", lr=1e-2, max_grad_norm=0.5)
    theirs = torch.optim.AdamW(qs, lr=1e-2)
    for _ in range(20):
        feed(ps, qs)
        torch.nn.utils.clip_grad_norm_(qs, 0.5)
        ours.step()
        theirs.step()
    for p, q in zip(ps, qs):
        close(p, q, "param", rtol=2e-5)
    assert ours.stats()[0]["reduction_passes"] == 1


def test_bf16_params_with_fp32_master_weights(seed):
    ps = make_params([(37, 53), (1031,)], dtype=torch.bfloat16)
    qs = [p.detach().float().requires_grad_() for p in ps]
    ours = ft.Optimizer(ps, rule="adamw", lr=1e-2, master_weights=True)
    theirs = torch.optim.AdamW(qs, lr=1e-2)
    for _ in range(30):
        for p, q in zip(ps, qs):
            g = torch.randn_like(q).bfloat16()
            p.grad = g
            q.grad = g.float()
        ours.step()
        theirs.step()
    for p, q in zip(ps, qs):
        close(ours.state[p]["master"], q, "master")
        assert p.dtype == torch.bfloat16
        close(p.float(), q, "bf16 param", rtol=8e-3)  # one bf16 rounding


def test_user_rule_text_and_rule_object(seed):
    adabelief = """
    param p
    grad g
    state m = 0, s = 0
    hyper lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-16
    m = beta1 * m + (1 - beta1) * g
    s = beta2 * s + (1 - beta2) * (g - m) * (g - m) + eps
    p = p - lr * (m / (1 - beta1 ^ step)) / (sqrt(s / (1 - beta2 ^ step)) + eps)
    """
    p = torch.randn(300, requires_grad=True)
    start = p.detach().double().clone()
    ours = ft.Optimizer([p], rule=fusedopt.Rule.parse(adabelief, "adabelief.rule"), lr=1e-2)
    assert ours.param_groups[0]["beta1"] == 0.9  # a user rule keeps its own names
    ref, m, s = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    for t in range(1, 51):
        g = torch.randn(300)
        p.grad = g
        ours.step()
        g = g.double()
        m = 0.9 * m + 0.1 * g
        s = 0.999 * s + 0.001 * (g - m) ** 2 + 1e-16
        ref = ref - 1e-2 * (m / (1 - 0.9 ** t)) / ((s / (1 - 0.999 ** t)).sqrt() + 1e-16)
    close(p, ref, "adabelief param")
    close(ours.state[p]["s"], s, "adabelief s")
    # The same text as a string.
    q = torch.randn(3, requires_grad=True)
    assert ft.Optimizer([q], rule=adabelief).rule.states == ["m", "s"]

