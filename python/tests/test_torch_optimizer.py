"""fusedopt.torch.Optimizer against torch.optim on the CPU: every preset with a torch
counterpart after 100 steps on the same fresh random data (params and every state), the
state_dict round trip torch -> fusedopt -> torch, LR schedulers without recompiles, params
without gradients, gradients that move, the AMP protocol, clipping, mixed precision, and
bad input as clear exceptions.

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


def test_a_malformed_rule_raises_rule_error_with_line_and_column():
    text = "param p\ngrad g\nhyper lr = 0.1\np = p - lr * gg\n"
    with pytest.raises(fusedopt.RuleError) as info:
        ft.Optimizer([torch.zeros(3, requires_grad=True)], rule=text)
    e = info.value
    assert (e.file, e.line, e.column) == ("<rule>", 4, 14)
    assert "unknown name 'gg'" in e.message
    assert "p = p - lr * gg" in str(e) and "^" in str(e)
    assert e.hint  # the nearest known name
    with pytest.raises(fusedopt.RuleError) as info:
        fusedopt.Rule.parse("param p\ngrad g\np = p - 0.1 * (g\n", "bad.rule")
    assert info.value.file == "bad.rule" and info.value.line == 3
    with pytest.raises(fusedopt.UsageError, match="unknown preset|no preset|preset"):
        ft.Optimizer([torch.zeros(3, requires_grad=True)], rule="adamz")


@pytest.mark.parametrize("make,match", [
    (lambda: _sparse_grad(), "sparse"),
    (lambda: _other_device(), "one device"),
], ids=["sparse", "device"])
def test_bad_input_is_a_clear_exception(make, match):
    opt, params = make()
    with pytest.raises(fusedopt.UsageError, match=match) as info:
        opt.step()
    assert "param_groups[0]['params']" in str(info.value)


def _sparse_grad():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    return ft.Optimizer(emb.parameters(), rule="sgd"), list(emb.parameters())


def _other_device():
    p = torch.randn(5, requires_grad=True)
    q = torch.empty(5, device="meta", requires_grad=True)
    p.grad = torch.ones(5)
    q.grad = torch.empty(5, device="meta")
    return ft.Optimizer([p, q], rule="sgd"), [p, q]


def test_a_moved_gradient_of_a_bad_kind_is_refused_and_nothing_changes():
    p = torch.randn(8, requires_grad=True)
    opt = ft.Optimizer([p], rule="sgd", lr=0.1)
    p.grad = torch.ones(8)
    opt.step()
    before = p.detach().clone()
    p.grad = torch.ones(8).to_sparse()  # same shape, a sparse gradient
    with pytest.raises(fusedopt.UsageError, match="gradient is sparse"):
        opt.step()
    assert torch.equal(p, before)


def test_unknown_hypers_are_refused():
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(fusedopt.UsageError, match="has no hyper 'momentum'"):
        ft.Optimizer([p], rule="adamw", momentum=0.9)
    with pytest.raises(fusedopt.UsageError, match="tuple of 2"):
        ft.Optimizer([p], rule="adamw", betas=0.9)
    with pytest.raises(fusedopt.UsageError, match="has no hyper 'mom'"):
        ft.Optimizer([{"params": [p], "mom": 0.1}], rule="sgd")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300])
def test_hypers_that_are_not_finite_fp32_numbers_are_refused(bad):
    p = torch.ones(3, requires_grad=True)
    p.grad = torch.full((3,), 0.5)
    with pytest.raises(fusedopt.UsageError, match="hyper 'lr' of group 0"):
        ft.Optimizer([p], rule="sgd", lr=bad)
    opt = ft.Optimizer([p], rule="sgd", lr=0.1)
    opt.param_groups[0]["lr"] = bad  # as a scheduler would: refused at the step
    with pytest.raises(fusedopt.UsageError, match="hyper 'lr' of group 0"):
        opt.step()
    assert torch.equal(p.detach(), torch.ones(3))  # the refused step changed nothing


def test_hyper_types_and_ranges_are_checked_as_torch_checks_them():
    p = torch.ones(3, requires_grad=True)
    # The same exception types, and for ranges the same messages, as torch.optim's own.
    for kwargs, error, match in [
            ({"lr": "1e-3"}, TypeError, "hyper 'lr' is '1e-3'"),
            ({"lr": -1.0}, ValueError, "Invalid learning rate: -1.0"),
            ({"eps": -1e-8}, ValueError, "Invalid epsilon value: -1e-08"),
            ({"betas": (1.0, 0.999)}, ValueError, "Invalid beta parameter at index 0: 1.0"),
            ({"betas": (0.9, -0.1)}, ValueError, "Invalid beta parameter at index 1: -0.1"),
            ({"weight_decay": -0.01}, ValueError, "Invalid weight_decay value: -0.01")]:
        with pytest.raises(error, match=match):
            ft.Optimizer([p], rule="adamw", **kwargs)
        with pytest.raises(error):
            torch.optim.AdamW([p], **kwargs)  # torch refuses the same
    with pytest.raises(ValueError, match="Invalid momentum value: -0.5"):
        ft.Optimizer([p], rule="sgd", lr=0.1, momentum=-0.5)
    # A param group added later is checked too, before it is added.
    opt = ft.Optimizer([p], rule="adamw")
    with pytest.raises(ValueError, match="Invalid learning rate"):
        opt.add_param_group({"params": [torch.ones(2, requires_grad=True)], "lr": -0.1})
    assert len(opt.param_groups) == 1
    # A user's rule: any finite number (its 'lr' may mean something else), never a string.
    rule = "param p\ngrad g\nhyper lr = 0.1\np = p - lr * g\n"
    ft.Optimizer([p], rule=fusedopt.Rule.parse(rule, "mine.rule"), lr=-1.0)
    with pytest.raises(TypeError, match="a hyper is a number"):
        ft.Optimizer([p], rule=fusedopt.Rule.parse(rule, "mine.rule"), lr="0.1")


def test_state_views_alias_the_kernels_memory(seed):
    p = torch.randn(10, requires_grad=True)
    opt = ft.Optimizer([p], rule="sgd", lr=0.1, momentum=0.9)
    p.grad = torch.ones(10)
    opt.step()
    buf = opt.state[p]["momentum_buffer"]
    assert torch.equal(buf, torch.ones(10))
    opt.step()
    assert torch.allclose(buf, torch.full((10,), 1.9))  # the same memory, updated in place


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


def test_a_deep_copy_steps_on_its_own(seed):
    import copy
    import pickle
    ps = make_params([(33,), (4, 8)])
    ours = ft.Optimizer(ps, rule="nadam", lr=1e-2)
    for _ in range(3):
        feed(ps)
        ours.step()
    twin_opt = copy.deepcopy(ours)
    qs = twin_opt.param_groups[0]["params"]
    assert all(q is not p for p, q in zip(ps, qs))
    compare_states(twin_opt, ours, rtol=0)
    for _ in range(3):
        feed(ps, qs)
        ours.step()
        twin_opt.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
    compare_states(twin_opt, ours, rtol=0)
    again = pickle.loads(pickle.dumps(ours))
    assert again.rule.name == "nadam"
    compare_states(again, ours, rtol=0)


def test_a_refused_rebind_changes_nothing(seed):
    ps = make_params([(64,), (64,)])
    qs = twin(ps)
    ours = ft.Optimizer(ps, rule="sgd", lr=0.1, momentum=0.9)
    theirs = torch.optim.SGD(qs, lr=0.1, momentum=0.9)
    feed(ps, qs)
    ours.step()
    theirs.step()
    ps[1].grad = ps[0].detach()  # a gradient in another param's memory: refused
    with pytest.raises(fusedopt.UsageError, match="overlaps"):
        ours.step()
    with pytest.raises(fusedopt.UsageError, match="overlaps"):  # not taken half-way
        ours.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
    feed(ps, qs)  # fresh, proper gradients: the step goes on from where it was
    ours.step()
    theirs.step()
    for p, q in zip(ps, qs):
        close(p, q, "param")


def test_factored_and_scalar_states_in_torchs_shapes_and_round_trip(seed):
    # adafactor (row/column states) and asgd (scalar states): torch's names and shapes in
    # the state, and a state_dict round trip whose next steps are bit for bit the same.
    for preset, names in (("adafactor", {(3, 37, 53): {"row_var": (3, 37, 1),
                                                       "col_var": (3, 1, 53)},
                                         (101,): {"variance": (101,)}}),
                          ("asgd", {(3, 37, 53): {"eta": (), "mu": (), "ax": (3, 37, 53)},
                                    (101,): {"eta": (), "mu": (), "ax": (101,)}})):
        ps = make_params(list(names))
        ours = ft.Optimizer(ps, rule=preset, lr=1e-2)
        for _ in range(4):
            feed(ps)
            ours.step()
        for p, want in zip(ps, names.values()):
            for key, shape in want.items():
                assert tuple(ours.state[p][key].shape) == shape, (preset, key)
        qs = twin(ps)
        other = ft.Optimizer(qs, rule=preset, lr=1.0)
        other.load_state_dict(ours.state_dict())
        for _ in range(3):
            feed(ps, qs)
            ours.step()
            other.step()
        for p, q in zip(ps, qs):
            assert torch.equal(p, q), preset
        compare_states(other, ours, rtol=0)


def test_steady_steps_follow_a_moved_param_and_a_replaced_grad(seed):
    # Grads updated in place (backward after zero_grad(set_to_none=False)) keep a step on its
    # steady path; a param moved to new storage (p.data = ...) or a grad replaced by a new
    # tensor in between must be followed: the step updates what the tensors hold now.
    ps = make_params([(1000,), (10, 10), (3,)])
    qs = twin(ps)
    ours = ft.Optimizer(ps, rule="adamw", lr=1e-2)
    theirs = torch.optim.AdamW(qs, lr=1e-2)
    for p in ps + qs:
        p.grad = torch.zeros_like(p)
    for k in range(6):
        for p, q in zip(ps, qs):
            g = torch.randn_like(p)
            p.grad.copy_(g)
            q.grad.copy_(g)
        if k == 3:
            old = ps[1].data
            ps[1].data = ps[1].data.clone()  # the param moves
            kept = old.clone()
        if k == 4:
            ps[0].grad = ps[0].grad.clone()  # the same values in a new tensor
        ours.step()
        theirs.step()
        if k == 3:
            assert torch.equal(old, kept), "the param's old storage was written"
        for p, q in zip(ps, qs):
            close(p, q, f"param after step {k + 1}")


def test_zero_grad_set_to_none_frees_the_gradients(seed):
    # The optimizer must not keep the last step's gradients alive: zero_grad(set_to_none=True)
    # frees them before the next backward, as it does with torch's optimizers.
    import gc
    import weakref
    ps = make_params([(1000,), (10, 10)])
    ours = ft.Optimizer(ps, rule="adamw")
    feed(ps)
    ours.step()
    refs = [weakref.ref(p.grad) for p in ps]
    ours.zero_grad(set_to_none=True)
    gc.collect()
    assert all(r() is None for r in refs)
    feed(ps)
    ours.step()  # new gradients, re-pointed


# ---- load_state_dict is all or nothing --------------------------------------------------
# Params of 2, 1, 0 and 3 dimensions in two groups (state indices 0, 1 | 2, 3).
LOAD_SHAPES = [(5, 4), (7,), (), (3, 2, 2)]


def stepped_twins(preset, kw, steps=2):
    """An optimizer after `steps` steps and its twin: the same params (cloned), hypers and
    gradients, so the two are equal bit for bit."""
    ps = make_params(LOAD_SHAPES)
    qs = twin(ps)
    opts = [ft.Optimizer([{"params": xs[:2]}, {"params": xs[2:], "weight_decay": 0.1}],
                         rule=preset, lr=1e-2, **kw) for xs in (ps, qs)]
    for _ in range(steps):
        feed(ps, qs)
        for opt in opts:
            opt.step()
    return opts


def _equal(x, y):
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and \
            x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, (tuple, list)) or isinstance(y, (tuple, list)):
        return type(x) is type(y) and len(x) == len(y) and all(map(_equal, x, y))
    return type(x) is type(y) and (x == y or (x != x and y != y))


def assert_same_optimizer(a, b):
    """a and b bit for bit: every key of every param group, every state (dtype included),
    the step counts, and the params and states after one more step on the same fresh
    gradients."""
    assert len(a.param_groups) == len(b.param_groups)
    for g, (x, y) in enumerate(zip(a.param_groups, b.param_groups)):
        assert set(x) == set(y), f"group {g}: keys {sorted(x)} != {sorted(y)}"
        for key in x:
            if key == "params":
                assert len(x[key]) == len(y[key])
                for p, q in zip(x[key], y[key]):
                    assert torch.equal(p, q), f"group {g}: a param changed"
            else:
                assert _equal(x[key], y[key]), f"group {g}: '{key}' {x[key]!r} != {y[key]!r}"

    def same_states():
        sa, sb = a.state_dict()["state"], b.state_dict()["state"]
        assert set(sa) == set(sb), f"params with state {sorted(sa)} != {sorted(sb)}"
        for i in sa:
            assert set(sa[i]) == set(sb[i]), f"param {i}: states {sorted(sa[i])} != " \
                f"{sorted(sb[i])}"
            for key in sa[i]:
                assert _equal(sa[i][key], sb[i][key]), f"param {i}: '{key}' differs"
    same_states()
    ps = [p for group in a.param_groups for p in group["params"]]
    qs = [q for group in b.param_groups for q in group["params"]]
    feed(ps, qs)
    a.step()
    b.step()
    for k, (p, q) in enumerate(zip(ps, qs)):
        assert torch.equal(p, q), f"param {k} after the next step"
    same_states()


def _set(path, value):
    """A mutation of a state dict: sd[path[0]][path[1]]... = value (None: delete it)."""
    def mutate(sd):
        target = sd
        for key in path[:-1]:
            target = target[key]
        if value is None:
            del target[path[-1]]
        else:
            target[path[-1]] = value(target[path[-1]]) if callable(value) else value
    return mutate


BAD_LOADS = [
    # (id, preset, constructor hypers, mutation, what the message says)
    ("step-2.5", "adamw", {}, _set(("state", 3, "step"), 2.5),
     r"step of parameter 3 is 2\.5; a step count is a whole number"),
    ("step-tensor-2.5", "adamw", {}, _set(("state", 3, "step"), torch.tensor(2.5)),
     r"step of parameter 3 is tensor\(2\.5"),
    ("step-minus-3", "adamw", {}, _set(("state", 3, "step"), -3), "step of parameter 3 is -3"),
    ("step-nan", "adamw", {}, _set(("state", 3, "step"), math.nan),
     "step of parameter 3 is nan"),
    ("step-inf-tensor", "adamw", {}, _set(("state", 3, "step"), torch.tensor(math.inf)),
     r"step of parameter 3 is tensor\(inf\)"),
    ("step-bool", "adamw", {}, _set(("state", 3, "step"), True),
     "step of parameter 3 is True"),
    ("step-string", "adamw", {}, _set(("state", 3, "step"), "2"),
     "step of parameter 3 is '2'"),
    ("step-past-2^53", "adamw", {}, _set(("state", 3, "step"), 2**60),
     "step of parameter 3 is 1152921504606846976"),
    ("step-2-elements", "adamw", {}, _set(("state", 3, "step"), torch.tensor([2.0, 2.0])),
     "step of parameter 3 is a tensor of 2 elements"),
    ("missing-exp_avg_sq", "adamw", {}, _set(("state", 3, "exp_avg_sq"), None),
     r"parameter 3 has no state 'exp_avg_sq' \(it has 'exp_avg', step 2\)"),
    ("no-states-but-a-step", "adamw", {},
     lambda sd: sd["state"].__setitem__(3, {"step": sd["state"][3]["step"]}),
     "parameter 3 has no state 'exp_avg' .it has no states, step 2"),
    ("transposed-state", "adamw", {}, _set(("state", 0, "exp_avg_sq"), lambda t: t.t()),
     r"state 'exp_avg_sq' of parameter 0 has shape \(4, 5\), the parameter has \(5, 4\)"),
    ("state-of-another-size", "adamw", {}, _set(("state", 1, "exp_avg"), torch.zeros(3)),
     r"state 'exp_avg' of parameter 1 has shape \(3,\), the parameter has \(7,\)"),
    ("0-d-param-state-of-1", "adamw", {}, _set(("state", 2, "exp_avg"), torch.zeros(1)),
     r"state 'exp_avg' of parameter 2 has shape \(1,\), the parameter has \(\)"),
    ("complex-state", "adamw", {},
     _set(("state", 3, "exp_avg"), lambda t: t.to(torch.complex64)),
     "state 'exp_avg' of parameter 3 has dtype torch.complex64"),
    ("bool-state", "adamw", {}, _set(("state", 3, "exp_avg"), lambda t: t > 0),
     "state 'exp_avg' of parameter 3 has dtype torch.bool"),
    ("state-not-a-tensor", "adamw", {}, _set(("state", 1, "exp_avg"), [0.0] * 7),
     "state 'exp_avg' of parameter 1 must be a tensor, not list"),
    ("state-of-an-unlisted-param", "adamw", {},
     lambda sd: sd["state"].__setitem__(9, dict(sd["state"][0])),
     "state for parameter 9, which no group lists"),
    ("entry-not-a-dict", "adamw", {}, _set(("state", 3), 5),
     "the state of parameter 3 must be a dict of states, not int"),
    ("param-listed-twice", "adamw", {}, _set(("param_groups", 1, "params"), [0, 3]),
     r"lists parameter 0 twice \(groups 0 and 1\)"),
    ("hyper-string", "adamw", {}, _set(("param_groups", 1, "lr"), "0.1"),
     r"param group 1: hyper 'lr' is '0\.1' \(a str\)"),
    ("hyper-nan", "adamw", {}, _set(("param_groups", 1, "lr"), math.nan),
     "hyper 'lr' of group 1 is nan"),
    ("hyper-past-fp32", "adamw", {}, _set(("param_groups", 0, "eps"), 1e300),
     "hyper 'eps' of group 0 is 1e[+]300"),
    ("betas-of-1", "adamw", {}, _set(("param_groups", 1, "betas"), (0.9,)),
     r"param group 1: hyper 'betas' is \(0\.9,\); it must be a tuple of 2"),
    ("betas-not-a-tuple", "adamw", {}, _set(("param_groups", 1, "betas"), 0.9),
     "param group 1: hyper 'betas' is 0.9; it must be a tuple of 2"),
    ("one-group-missing", "adamw", {}, lambda sd: sd["param_groups"].pop(),
     "different number of parameter groups"),
    ("one-param-missing", "adamw", {}, _set(("param_groups", 1, "params"), [2]),
     "group 1 has 1 parameters, this optimizer's has 2"),
    ("rmsprop-momentum-without-its-buffer", "rmsprop", dict(momentum=0.9),
     _set(("state", 3, "momentum_buffer"), None),
     "parameter 3 has no state 'momentum_buffer'"),
    ("adafactor-row-state-of-another-shape", "adafactor", {},
     _set(("state", 0, "row_var"), lambda t: t.reshape(1, 5)),
     r"state 'row_var' of parameter 0 has shape \(1, 5\), the row state of a parameter of "
     r"shape \(5, 4\) has \(5, 1\)"),
    ("adafactor-missing-col_var", "adafactor", {}, _set(("state", 3, "col_var"), None),
     "parameter 3 has no state 'col_var'"),
    ("asgd-scalar-state-of-1", "asgd", {}, _set(("state", 3, "eta"), lambda t: t.reshape(1)),
     r"state 'eta' of parameter 3 has shape \(1,\), a scalar state has shape \(\)"),
    ("nadam-missing-mu_product", "nadam", {}, _set(("state", 0, "mu_product"), None),
     "parameter 0 has no state 'mu_product'"),
]


@pytest.mark.parametrize("preset,kw,mutate,match", [c[1:] for c in BAD_LOADS],
                         ids=[c[0] for c in BAD_LOADS])
def test_a_refused_load_state_dict_changes_nothing(seed, preset, kw, mutate, match):
    # Everything is checked before anything is taken: a bad state dict raises a ValueError
    # naming the parameter (or group), the state and the problem, and the optimizer stays
    # bit for bit its twin's: groups, states, steps and the next step.
    ours, other = stepped_twins(preset, kw)
    import copy
    bad = copy.deepcopy(other.state_dict())
    for group in bad["param_groups"]:
        group["lr"] = 0.5  # were the groups taken, the twins would differ
    mutate(bad)
    with pytest.raises(ValueError, match=match):
        ours.load_state_dict(bad)
    assert_same_optimizer(ours, other)


def test_load_state_dict_takes_torchs_spellings_of_steps_and_states(seed):
    # What torch's optimizers and older checkpoints hold loads, and steps on bit for bit:
    # the step as an int, a whole float, a 0-d or 1-element tensor; a state in float64; a
    # torch 1.x scalar state as a number; torch's states left out where they are unused.
    import copy

    def adamw(sd):
        sd["state"][0]["step"] = 2
        sd["state"][1]["step"] = 2.0
        sd["state"][2]["step"] = torch.tensor([2.0])
        sd["state"][3]["exp_avg"] = sd["state"][3]["exp_avg"].double()

    def asgd(sd):
        sd["state"][1]["mu"] = sd["state"][1]["mu"].item()

    def rmsprop(sd):  # torch's RMSprop: no grad_avg unless centered, no momentum_buffer
        for entry in sd["state"].values():  # without momentum
            del entry["grad_avg"], entry["momentum_buffer"]

    def adafactor(sd):  # torch's Adafactor: no col_var below 2-D, a 0-d param's variance 0-d
        del sd["state"][1]["col_var"], sd["state"][2]["col_var"]
        sd["state"][2]["variance"] = sd["state"][2]["variance"].reshape(())

    for preset, edit, whole in (("adamw", adamw, True), ("asgd", asgd, True),
                                ("rmsprop", rmsprop, False), ("adafactor", adafactor, False)):
        ours, other = stepped_twins(preset, {})
        sd = copy.deepcopy(ours.state_dict())
        edit(sd)
        qs = twin([p for g in ours.param_groups for p in g["params"]])
        loaded = ft.Optimizer([{"params": qs[:2]}, {"params": qs[2:]}], rule=preset, lr=1.0)
        loaded.load_state_dict(sd)
        if whole:
            assert_same_optimizer(loaded, other)
        else:  # the states left out are not in its state until the next step
            ps = [p for g in other.param_groups for p in g["params"]]
            for _ in range(2):
                feed(qs, ps)
                loaded.step()
                other.step()
                for k, (q, p) in enumerate(zip(qs, ps)):
                    assert torch.equal(q, p), f"{preset}: param {k}"
    # Its own state dict (views of the kernels' memory) loads into itself unchanged.
    ours, other = stepped_twins("nadam", {})
    ours.load_state_dict(ours.state_dict())
    assert_same_optimizer(ours, other)
    # A checkpoint without amsgrad into adamw+amsgrad: a warning, and max_exp_avg_sq starts
    # from its initial value (the rule decides).
    ours, _ = stepped_twins("adamw", {})
    qs = twin([p for g in ours.param_groups for p in g["params"]])
    amsgrad = ft.Optimizer([{"params": qs[:2]}, {"params": qs[2:]}], rule="adamw+amsgrad")
    with pytest.warns(UserWarning, match="amsgrad=False"):
        amsgrad.load_state_dict(ours.state_dict())
    assert float(amsgrad.state_dict()["state"][3]["step"]) == 2


def test_a_warning_made_an_error_stops_load_state_dict_before_it_changes_anything(seed):
    # The amsgrad warning comes before anything is taken: under an "error" filter the load
    # stops with the optimizer as it was.
    import copy
    import warnings
    ours, other = stepped_twins("adamw", {})
    sd = copy.deepcopy(other.state_dict())
    for group in sd["param_groups"]:
        group["lr"] = 0.5
    sd["param_groups"][1]["amsgrad"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="group 1 has amsgrad=True"):
            ours.load_state_dict(sd)
    assert_same_optimizer(ours, other)


def test_add_param_group_refuses_hypers_that_are_not_numbers_or_tuples_of_their_length():
    # A string is not a number (it was read with float()): a TypeError, as torch.optim's
    # own checks raise (issue 29); and a tuple key that is no tuple is not silently the
    # default.
    p, q = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    opt = ft.Optimizer([p], rule="adamw")
    with pytest.raises(TypeError, match=r"param group 1: hyper 'lr' is '0\.1'"):
        opt.add_param_group({"params": [q], "lr": "0.1"})
    with pytest.raises(fusedopt.UsageError, match="hyper 'betas' is 0.9; it must be a tuple"):
        opt.add_param_group({"params": [q], "betas": 0.9})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [q], "lr": 0.1, "maximize": True})  # booleans as 0/1
