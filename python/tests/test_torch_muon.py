"""The muon preset from PyTorch: fusedopt.torch.Optimizer(params, "muon", ...) against
torch.optim.Muon itself (torch >= 2.9; the tests that need it skip, saying so, under an older
torch) and against a float64 Muon written out here; the state_dict both ways; bad input.

Tolerances (each measured, then set with a margin; the numbers are in the comments):
- matrix_precision="fp32" vs the float64 reference: the iteration in fp32 differs from float64
  by fp32 rounding only; params and momentum_buffer to RTOL_FP32 (relative to each tensor's
  largest magnitude, as test_torch_optimizer.close measures).
- matrix_precision="bf16" vs torch.optim.Muon (which iterates in bf16): the momentum buffer
  does not depend on the iteration (fp32 lerp of the same gradients in both): RTOL_BUF. The
  updates differ by what the bf16 rounding inside the Newton-Schulz GEMMs explains: the two
  GEMM implementations (torch's bf16 addmm, fusedopt's fp32-accumulating GEMM rounded to
  bf16) round some intermediate elements to neighbouring bf16 values. Each step's update is
  read off the params (the gap carried over from the last step, shrunk by the weight decay,
  taken out) and must be within BF16_ULPS bf16 ulps (2^-8 relative) of torch's update, in
  norm; the gradients do not depend on the params, so the steps' differences only add up, and
  a later comparison of params after T steps is bounded by T such steps.
"""
import contextlib
import copy
import math

import pytest
import torch

import fusedopt
import fusedopt.torch as ft
from fusedopt.torch.hypers import TORCH_PRESETS
from test_torch_optimizer import close, twin

HAS_MUON = hasattr(torch.optim, "Muon")
needs_torch_muon = pytest.mark.skipif(
    not HAS_MUON, reason=f"torch.optim.Muon is absent in torch {torch.__version__} (it came "
    "in torch 2.9): the comparison with torch's own Muon needs it")

STEPS = 50
# measured over 16 runs: params <= 1.0e-6, momentum_buffer <= 1.3e-7 (of the largest magnitude)
RTOL_FP32 = 2.5e-6
RTOL_BUF = 1e-6    # the same fp32 lerp on both sides
# Each step's update against torch's: the norm of the difference over the norm of torch's
# update, in bf16 ulps (2^-8). Measured (14 runs): up to 3.6 with torch's default coefficients,
# up to 0.85 with (2, -1.5, 0.5). One rounding flip is one ulp of one element; the quintic's
# slope at small singular values (a = 3.4445) grows a flip of an early round in each later one,
# hence several ulps with the default coefficients. 8: about twice the largest measured.
# Said plainly: an fp32 iteration measures 4.2 to 4.7 (defaults) and 1.4 to 1.8 (other)
# against torch's bf16 one, so this bound says the update is torch's up to bf16-sized
# rounding, not that the rounding is torch's; test_matrix_precision_reaches_the_kernel checks
# that the bf16 option changes the result.
BF16_ULPS = 8.0
# The same per step for the largest element (measured up to 11): the bound for params after
# T steps of the state dict round trip, T * lr * ratio * 1.2 (the update's elements stay below
# 1.2: the iteration's singular values do) * BF16_ELEMENT_ULPS * 2^-8.
BF16_ELEMENT_ULPS = 24.0
BF16_ULP = 2.0 ** -8

# square, tall and wide hidden matrices (a batch of them steps in one launch)
SHAPES = [(64, 64), (96, 48), (40, 72)]
ADJUST = {None: 0, "original": 0, "match_rms_adamw": 1, "spectral_unclamped": 2}
DEFAULTS = dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5,
                adjust_lr_fn=None)
# a non-default set: no nesterov, Moonshot's lr adjustment, other coefficients and steps
OTHER = dict(lr=2e-2, weight_decay=0.01, momentum=0.9, nesterov=False,
             ns_coefficients=(2.0, -1.5, 0.5), eps=1e-6, ns_steps=7,
             adjust_lr_fn="match_rms_adamw")
HYPERS = [pytest.param(DEFAULTS, id="defaults"), pytest.param(OTHER, id="other")]


def ratio(shape, adjust_lr_fn):
    rows, cols = shape[-2], shape[-1]  # the param's last two dimensions (the rule's rows, cols)
    fn = ADJUST[adjust_lr_fn]
    if fn == 1:
        return 0.2 * math.sqrt(max(rows, cols))
    if fn == 2:
        return math.sqrt(rows / cols)
    return math.sqrt(max(1.0, rows / cols))


def newton_schulz64(u, steps, a, b, c, eps):
    """Muon's iteration in float64 on u as the matrix of its first dimension by the rest (a
    conv's filters flattened, as Keller Jordan's reference does), on the wide side."""
    x = u.reshape(u.shape[0], -1)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / max(x.norm().item(), eps)
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    if tall:
        x = x.T
    return x.reshape(u.shape)


@contextlib.contextmanager
def one_thread():
    """float64 matmuls of these small sizes on one thread: on a loaded machine torch's pool of
    threads spins (the reference took 23 s on 2 busy cores, 0.1 s on one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def muon64(p0, grads, lr, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps,
           adjust_lr_fn):
    """torch.optim.Muon's step, written out in float64: (param, momentum_buffer, the largest
    |update| of any step)."""
    p = p0.double().clone()
    buf = torch.zeros_like(p)
    biggest = 0.0
    with one_thread():
        for g in grads:
            g = g.double()
            buf = buf.lerp(g, 1 - momentum)
            u = g.lerp(buf, momentum) if nesterov else buf
            u = newton_schulz64(u, ns_steps, *ns_coefficients, eps)
            biggest = max(biggest, u.abs().max().item())
            p = p * (1 - lr * weight_decay)
            p = p - lr * ratio(p.shape, adjust_lr_fn) * u
    return p, buf, biggest


def run(ps, grads, **kw):
    opt = ft.Optimizer(ps, "muon", **kw)
    for t in range(len(grads[0])):
        for p, g in zip(ps, grads):
            p.grad = g[t].clone()
        opt.step()
    return opt


@pytest.mark.parametrize("hypers", HYPERS)
def test_fp32_iteration_matches_a_float64_reference(seed, hypers):
    shapes = SHAPES + [(8, 3, 3, 3)]  # and a conv's filters: 8 x 27 for the iteration
    ps = [torch.randn(s).requires_grad_() for s in shapes]
    start = [p.detach().clone() for p in ps]
    grads = [[torch.randn_like(p) for _ in range(STEPS)] for p in ps]
    opt = run(ps, grads, **hypers)
    assert opt.engine_builds == 1
    worst = {"param": 0.0, "buf": 0.0}
    for i, (p, p0, g) in enumerate(zip(ps, start, grads)):
        want, buf, _ = muon64(p0, g, **hypers)
        got_buf = opt.state[p]["momentum_buffer"]
        for key, got, ref in (("param", p, want), ("buf", got_buf, buf)):
            err = ((got.double() - ref).abs() / (ref.abs() + ref.abs().max())).max().item()
            worst[key] = max(worst[key], err)
        close(p, want, f"param {i} {tuple(p.shape)}", RTOL_FP32)
        close(got_buf, buf, f"param {i} momentum_buffer", RTOL_FP32)
        assert float(opt.state[p]["step"]) == STEPS
    print(f"fp32 iteration vs float64: worst relative error params {worst['param']:.3g}, "
          f"momentum_buffer {worst['buf']:.3g}")


@needs_torch_muon
@pytest.mark.parametrize("hypers", HYPERS)
def test_bf16_iteration_matches_torch_muon(seed, hypers):
    # Small params (0.01 randn): each step's update difference is read off the params, and
    # the params' own fp32 rounding must stay far below a bf16 ulp of the update (with params
    # of magnitude 1 and lr 1e-3 it is about one, and the measure would be noise).
    ps = [(0.01 * torch.randn(s)).requires_grad_() for s in SHAPES]
    qs = twin(ps)
    start = [p.detach().clone() for p in ps]
    ours = ft.Optimizer(ps, "muon", matrix_precision="bf16", **hypers)
    theirs = torch.optim.Muon(qs, **hypers)
    shrink = 1 - hypers["lr"] * hypers["weight_decay"]
    sizes = [hypers["lr"] * ratio(p.shape, hypers["adjust_lr_fn"]) for p in ps]
    worst = [0.0] * len(ps)
    for _ in range(STEPS):
        before = [(p - q).detach().double() for p, q in zip(ps, qs)]
        last = [q.detach().double() for q in qs]
        for p, q in zip(ps, qs):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        ours.step()
        theirs.step()
        for i, (p, q) in enumerate(zip(ps, qs)):
            # this step's updates, ours minus torch's (the gap carried over shrinks by the
            # weight decay), in bf16 ulps of the norm of torch's update
            u = (shrink * last[i] - q.detach().double()) / sizes[i]
            d = ((p - q).detach().double() - shrink * before[i]) / sizes[i]
            worst[i] = max(worst[i], d.norm().item() / (u.norm().item() * BF16_ULP))
    for i, (p, q, p0) in enumerate(zip(ps, qs, start)):
        what = f"param {i} {tuple(p.shape)}"
        close(ours.state[p]["momentum_buffer"], theirs.state[q]["momentum_buffer"],
              f"{what} momentum_buffer", RTOL_BUF)
        gap = (p - q).abs().max().item()
        print(f"{what}: each step's update within {worst[i]:.3g} bf16 ulps of torch's (in "
              f"norm); after {STEPS} steps |fusedopt - torch| {gap:.3g} "
              f"(lr * ratio = {sizes[i]:.3g})")
        assert worst[i] <= BF16_ULPS, f"{what}: an update {worst[i]:.3g} bf16 ulps off torch's"
        # and the params did move by more than that: the comparison can tell a wrong update
        moved = (q - p0).abs().max().item()
        assert moved > 20 * gap, f"{what}: moved {moved:.3g}, gap {gap:.3g}"


def test_matrix_precision_reaches_the_kernel_and_bad_values_are_refused(seed):
    p = torch.randn(48, 32, requires_grad=True)
    q = twin([p])[0]
    p0 = p.detach().clone()
    g = torch.randn_like(p)
    for x, precision in ((p, "fp32"), (q, torch.bfloat16)):
        opt = ft.Optimizer([x], "muon", lr=0.1, matrix_precision=precision)
        x.grad = g.clone()
        opt.step()
    want, _, _ = muon64(p0, [g], **dict(DEFAULTS, lr=0.1))
    close(p, want, "fp32 step", RTOL_FP32)
    step = 0.1 * ratio(p.shape, None)
    gap = (q - want).abs().max().item()
    print(f"one bf16 step off float64 by {gap / (step * BF16_ULP):.3g} bf16 ulps of lr * ratio")
    # bf16 rounds the iteration: off the float64 step by more than fp32 is (1e-6), and by
    # bf16's size: a few ulps of lr * ratio (measured 1.7 to 2.8; see BF16_ULPS)
    assert 1e-6 * step < gap <= step * BF16_ULPS * BF16_ULP, gap
    with pytest.raises(fusedopt.UsageError, match="matrix_precision is 'fp16'"):
        ft.Optimizer([p], "muon", matrix_precision="fp16")


@needs_torch_muon
def test_state_dict_round_trip_with_torch_muon(seed):
    hypers = dict(lr=2e-2, momentum=0.9, ns_steps=6, adjust_lr_fn="spectral_unclamped")
    ps = [torch.randn(s).requires_grad_() for s in SHAPES]
    qs, rs = twin(ps), twin(ps)
    theirs = torch.optim.Muon(qs, **hypers)

    def feed(*lists):
        for group in zip(*lists):
            g = torch.randn_like(group[0])
            for x in group:
                x.grad = g.clone()

    for _ in range(5):
        feed(qs)
        theirs.step()
    with torch.no_grad():
        for p, q in zip(ps, qs):
            p.copy_(q)
    # torch -> fusedopt: the groups' keys (ns_coefficients, adjust_lr_fn's name) and the
    # momentum buffers.
    ours = ft.Optimizer(ps, "muon", matrix_precision="bf16")
    ours.load_state_dict(theirs.state_dict())
    group = ours.param_groups[0]
    assert group["adjust_lr_fn"] == "spectral_unclamped" and group["ns_steps"] == 6
    for p, q in zip(ps, qs):
        assert torch.equal(ours.state[p]["momentum_buffer"], theirs.state[q]["momentum_buffer"])
    live = ft.from_torch(theirs, matrix_precision="bf16")
    assert live.rule.name == "muon" and live.param_groups[0]["lr"] == 2e-2
    for _ in range(5):
        feed(ps, qs)
        ours.step()
        theirs.step()
    for i, (p, q) in enumerate(zip(ps, qs)):
        close(ours.state[p]["momentum_buffer"], theirs.state[q]["momentum_buffer"],
              f"param {i} momentum_buffer", RTOL_BUF)
        # 10 steps of updates (elements below 1.2: the iteration's singular values stay
        # below it), each within BF16_ELEMENT_ULPS of torch's
        bound = 10 * 2e-2 * ratio(p.shape, "spectral_unclamped") * 1.2 * BF16_ELEMENT_ULPS * \
            BF16_ULP
        assert (p - q).abs().max().item() <= bound, f"param {i}"
    # fusedopt -> torch: torch's Muon reads our groups (ns_steps an int, adjust_lr_fn a name)
    state = copy.deepcopy(ours.state_dict())
    g0 = state["param_groups"][0]
    assert type(g0["ns_steps"]) is int and g0["ns_coefficients"] == (3.4445, -4.7750, 2.0315)
    assert set(state["state"][0]) == {"momentum_buffer", "step"}
    with torch.no_grad():
        for r, p in zip(rs, ps):
            r.copy_(p)
    back = torch.optim.Muon(rs, lr=1.0)
    back.load_state_dict(state)
    assert back.param_groups[0]["lr"] == 2e-2
    for _ in range(5):
        feed(ps, rs)
        ours.step()
        back.step()
    for i, (p, r) in enumerate(zip(ps, rs)):
        close(ours.state[p]["momentum_buffer"], back.state[r]["momentum_buffer"],
              f"param {i} momentum_buffer after fusedopt -> torch", RTOL_BUF)
        bound = 5 * 2e-2 * ratio(p.shape, "spectral_unclamped") * 1.2 * BF16_ELEMENT_ULPS * \
            BF16_ULP
        assert (p - r).abs().max().item() <= bound, f"param {i} after fusedopt -> torch"


def test_torch_keywords_and_defaults_as_torch_keeps_them():
    p = torch.randn(16, 8, requires_grad=True)
    opt = ft.Optimizer([p], "muon")
    group = opt.param_groups[0]
    for key, value in DEFAULTS.items():
        assert group[key] == value and type(group[key]) is type(value), key
    assert TORCH_PRESETS["Muon"] == "muon"


def test_a_1d_param_is_refused_naming_it():
    w = torch.randn(8, 4, requires_grad=True)
    bias = torch.randn(8, requires_grad=True)
    with pytest.raises(fusedopt.UsageError) as info:
        opt = ft.Optimizer([w, bias], "muon")
        for x in (w, bias):
            x.grad = torch.ones_like(x)
        opt.step()
    message = str(info.value)
    assert "param_groups[0]['params'][1]" in message and "(8,)" in message, message
    assert "2" in message and "adamw" in message, message


@pytest.mark.parametrize("value", ["rms", 3, -1])
def test_a_bad_adjust_lr_fn_is_refused(value):
    p = torch.randn(8, 4, requires_grad=True)
    if isinstance(value, str):
        with pytest.raises(ValueError, match=f"Adjust learning rate function {value} is not "):
            ft.Optimizer([p], "muon", adjust_lr_fn=value)
    opt = ft.Optimizer([p], "muon")
    p.grad = torch.randn_like(p)
    before = p.detach().clone()
    opt.param_groups[0]["adjust_lr_fn"] = value
    with pytest.raises(fusedopt.UsageError, match="param group 0") as info:
        opt.step()
    assert "adjust_lr_fn" in str(info.value), str(info.value)
    assert torch.equal(p, before)


@pytest.mark.parametrize("value", [0, 101, 2.5])
def test_ns_steps_out_of_range_is_refused_before_anything_changes(seed, value):
    p = torch.randn(8, 4, requires_grad=True)
    opt = ft.Optimizer([p], "muon")
    p.grad = torch.randn_like(p)
    opt.step()
    before = p.detach().clone()
    buf = opt.state[p]["momentum_buffer"].clone()
    opt.param_groups[0]["ns_steps"] = value
    with pytest.raises(fusedopt.UsageError) as info:
        opt.step()
    message = str(info.value)
    assert "param group 0" in message and "ns_steps" in message and "1 to 100" in message, \
        message
    assert torch.equal(p, before) and torch.equal(opt.state[p]["momentum_buffer"], buf)
    opt.param_groups[0]["ns_steps"] = 5
    opt.step()  # and it steps again once fixed
    assert float(opt.state[p]["step"]) == 2


@pytest.mark.parametrize("key,value,message", [
    ("lr", -1.0, "Learning rate should be >= 0 but is: -1.0"),
    ("momentum", -0.5, "momentum should be >= 0 but is: -0.5"),
    ("weight_decay", -0.1, "weight decay should be >= 0 but is: -0.1"),
])
def test_torch_range_checks(key, value, message):
    p = torch.randn(8, 4, requires_grad=True)
    with pytest.raises(ValueError, match=message):
        ft.Optimizer([p], "muon", **{key: value})
    if HAS_MUON:  # the same refusal as torch's
        with pytest.raises(ValueError, match=message):
            torch.optim.Muon([p], **{key: value})


# ---- Muon and AdamW in one optimizer: param groups naming their own rule ---------------------

class TinyTransformer(torch.nn.Module):
    """An embedding, two blocks (LayerNorm, an MLP of two Linear layers, residual) and a
    head: the shapes a Muon + AdamW training splits (hidden matrices to Muon; the embedding,
    the head, the LayerNorms and the biases to AdamW)."""

    def __init__(self, vocab=32, dim=48, classes=10):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict({"norm": torch.nn.LayerNorm(dim),
                                 "up": torch.nn.Linear(dim, 2 * dim),
                                 "down": torch.nn.Linear(2 * dim, dim)}) for _ in range(2))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block["down"](torch.nn.functional.gelu(block["up"](block["norm"](x))))
        return self.head(self.norm(x).mean(dim=1))


def split(model):
    hidden = [p for name, p in model.named_parameters() if name.startswith("blocks") and
              p.dim() == 2]
    others = [p for name, p in model.named_parameters() if not (name.startswith("blocks") and
                                                                 p.dim() == 2)]
    return hidden, others


MUON_KW = dict(lr=0.02, momentum=0.95, weight_decay=0.01)
ADAMW_KW = dict(lr=3e-3, weight_decay=0.01)


def mixed(model, **options):
    hidden, others = split(model)
    return ft.Optimizer([{"params": hidden},
                         {"params": others, "rule": "adamw", **ADAMW_KW}],
                        "muon", **MUON_KW, **options)


def train(model, opts, tokens, labels, steps):
    losses = []
    for _ in range(steps):
        for opt in opts:
            opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens), labels)
        loss.backward()
        for opt in opts:
            opt.step()
        losses.append(loss.item())
    return losses


def task(seed):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 32, (256, 12), generator=gen)
    labels = torch.randint(0, 10, (256,), generator=gen)
    return tokens, labels


def test_a_group_of_its_own_rule_steps_as_that_rule_alone(seed):
    # One optimizer (muon, with an adamw group) against two fusedopt optimizers of one rule
    # each, on the same model and data: the same kernels, so the same bits.
    a = TinyTransformer()
    b = copy.deepcopy(a)
    tokens, labels = task(seed)
    one = mixed(a)
    hidden, others = split(b)
    two = [ft.Optimizer(hidden, "muon", **MUON_KW), ft.Optimizer(others, "adamw", **ADAMW_KW)]
    train(a, [one], tokens, labels, 20)
    train(b, two, tokens, labels, 20)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert one.engine_builds == 2 and len(one.stats()) == 2  # a launch per rule
    # torch's layout: one index per param over both groups, each with its rule's states
    state = one.state_dict()
    groups = state["param_groups"]
    assert "rule" not in groups[0] and groups[1]["rule"] == "adamw"
    assert groups[0]["ns_steps"] == 5 and "betas" not in groups[0]
    assert groups[1]["betas"] == (0.9, 0.999) and "momentum" not in groups[1]
    assert groups[1]["lr"] == 3e-3 and groups[0]["lr"] == 0.02
    for i in groups[0]["params"]:
        assert set(state["state"][i]) == {"momentum_buffer", "step"}
    for i in groups[1]["params"]:
        assert set(state["state"][i]) == {"exp_avg", "exp_avg_sq", "step"}
    # and it loads into a new mixed optimizer, which steps on as this one does
    c = copy.deepcopy(a)
    again = mixed(c)
    again.load_state_dict(copy.deepcopy(state))
    train(a, [one], tokens, labels, 3)
    train(c, [again], tokens, labels, 3)
    for (name, p), q in zip(a.named_parameters(), c.parameters()):
        assert torch.equal(p, q), f"{name} after load_state_dict"
    # a group's hypers are its rule's: an lr change reaches only that group's engine
    one.param_groups[1]["lr"] = 0.0
    before = [p.detach().clone() for p in split(a)[1]]
    train(a, [one], tokens, labels, 1)
    assert all(torch.equal(p, q) for p, q in zip(split(a)[1], before))


def test_a_group_of_its_own_rule_is_checked_as_that_rule():
    w = torch.randn(8, 4, requires_grad=True)
    bias = torch.randn(8, requires_grad=True)
    with pytest.raises(fusedopt.UsageError, match="rule 'adamw' has no hyper 'ns_steps'"):
        ft.Optimizer([{"params": [w]}, {"params": [bias], "rule": "adamw", "ns_steps": 3}],
                     "muon")
    with pytest.raises(ValueError, match="Invalid beta parameter at index 0"):
        ft.Optimizer([{"params": [w]}, {"params": [bias], "rule": "adamw",
                                        "betas": (1.5, 0.9)}], "muon")
    with pytest.raises(fusedopt.UsageError, match="max_grad_norm"):
        ft.Optimizer([{"params": [w]}, {"params": [bias], "rule": "adamw"}], "muon",
                     max_grad_norm=1.0)


@needs_torch_muon
def test_mixed_muon_adamw_trains_as_torch_muon_plus_adamw(seed):
    # The acceptance: a small transformer-ish model trained 150 steps by fusedopt's
    # one optimizer (muon with an adamw group) and by torch.optim.Muon + torch.optim.AdamW,
    # from the same init on the same data: final losses within 2%.
    a = TinyTransformer()
    b = copy.deepcopy(a)
    tokens, labels = task(seed)
    ours = mixed(a, matrix_precision="bf16")
    hidden, others = split(b)
    theirs = [torch.optim.Muon(hidden, **MUON_KW), torch.optim.AdamW(others, **ADAMW_KW)]
    got = train(a, [ours], tokens, labels, 150)
    want = train(b, theirs, tokens, labels, 150)
    print(f"mixed training losses: start {want[0]:.4f}; after 150 steps fusedopt {got[-1]:.4f}, "
          f"torch {want[-1]:.4f} ({abs(got[-1] - want[-1]) / want[-1]:.2%} apart)")
    assert want[-1] < 0.8 * want[0]  # it learns (a comparison of two stuck runs says nothing)
    assert abs(got[-1] - want[-1]) <= 0.02 * want[-1]
