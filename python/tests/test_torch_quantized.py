"""Block-quantized states from PyTorch: the quantized presets (adamw8bit, adamw4bit, ...) and
any rule with state_storage train a small model as well as fp32 AdamW; the codes and absmax
show in state[p] and round-trip through state_dict bit for bit."""
import copy

import pytest
import torch

import fusedopt.torch as ft

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


def model_and_data(seed):
    """An MLP whose two big weights (8192 elements) are quantized, and a noisy regression task:
    a teacher network's outputs plus noise (variance 0.01), 8192 training samples and 2048
    held out."""
    torch.manual_seed(seed)
    x = torch.randn(8192 + 2048, 64)
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    with torch.no_grad():
        y = teacher(x) + 0.1 * torch.randn(len(x), 1)
    torch.manual_seed(seed + 1)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, 1))
    return net, x, y


def train(seed, steps=300, **kw):
    """Minibatches of 128 in a fixed order; the held-out loss at the end."""
    net, x, y = model_and_data(seed)
    opt = ft.Optimizer(net.parameters(), **kw)
    order = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = torch.randint(0, 8192, (128,), generator=order)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x[batch]), y[batch])
        loss.backward()
        opt.step()
    with torch.no_grad():
        return torch.nn.functional.mse_loss(net(x[8192:]), y[8192:]).item(), opt, net


def test_quantized_presets_train_as_well_as_fp32_adamw(seed):
    base, _, _ = train(seed, rule="adamw", lr=1e-3)
    losses = {}
    for rule in ("adamw8bit", "adamw4bit", "adamw4bit+sr"):
        losses[rule], opt, net = train(seed, rule=rule, lr=1e-3)
        big = net[0].weight
        assert opt.state[big]["m"].dtype == torch.uint8  # quantized indeed
    print(f"final loss after 300 steps: adamw (fp32 states) {base:.6f}, " +
          ", ".join(f"{k} {v:.6f} ({v / base - 1:+.2%})" for k, v in losses.items()))
    # 8-bit: within 2% (measured -0.04% to +1.08% over 40 seeds). 4-bit, torchao's algorithm:
    # +0.1% to +4.9% over 40 seeds (mean +1.9%, sd 1.1%), +5.7% at seed 1429932810: v's
    # zero-free linear map rounds to nearest, and with beta2 = 0.999 a step moves v by far less
    # than half a code, so v stays where it was (with v at 8 bits: -1.1% to +0.7%). A float64
    # simulation of torchao's algorithm gives the same losses, so this bound is about the
    # algorithm, not the kernels: a broken map, nibble or absmax lands far beyond it.
    # adamw4bit+sr draws v's codes stochastically (unbiased), so v follows the gradients:
    # -1.1% to +0.4% over 41 seeds (mean -0.1%), +0.2% at seed 1429932810.
    assert abs(losses["adamw8bit"] / base - 1) <= 0.02
    assert abs(losses["adamw4bit"] / base - 1) <= 0.08
    assert abs(losses["adamw4bit+sr"] / base - 1) <= 0.02


def test_any_rule_trains_with_q8_states(seed):
    base, _, _ = train(seed, rule=ADABELIEF, lr=1e-3)
    loss, opt, net = train(seed, rule=ADABELIEF, lr=1e-3, state_storage="q8")
    state = opt.state[net[0].weight]
    assert state["m"].dtype == torch.uint8 and state["s"].dtype == torch.uint8
    assert state["m.absmax"].shape == (8192 // 256,)
    assert opt.state[net[4].weight]["m"].dtype == torch.float32  # 64 elements: kept fp32
    print(f"AdaBelief, 300 steps: fp32 states {base:.6f}, q8 states {loss:.6f}")
    # -0.11% to +3.35% over 41 seeds (mean +0.8%; +2.22% at seed 904684138, +3.35% at seed
    # 718349404), measured 2026-11-27 after a CI run failed the earlier 2% bound (never
    # calibrated) at +2.22%. Why AdaBelief's q8 s spreads more than Adam's v is not known.
    # A broken map, sign fix or absmax lands far beyond 5%.
    assert abs(loss / base - 1) <= 0.05


@pytest.mark.parametrize("rule,storage", [("adamw8bit", None), ("adamw", {"m": "q4s", "v": "q8u"})])
def test_quantized_states_round_trip_through_state_dict(seed, rule, storage):
    _, opt, net = train(seed, steps=3, rule=rule, lr=1e-2, state_storage=storage)
    saved = copy.deepcopy(opt.state_dict())
    twin = copy.deepcopy(net)
    opt2 = ft.Optimizer(twin.parameters(), rule=rule, lr=1e-2, state_storage=storage)
    opt2.load_state_dict(saved)
    for p, q in zip(net.parameters(), twin.parameters()):
        for key, value in opt.state[p].items():
            other = opt2.state[q][key]
            assert isinstance(other, torch.Tensor) == isinstance(value, torch.Tensor)
            if isinstance(value, torch.Tensor):
                assert value.dtype == other.dtype and torch.equal(value, other), key
    x = torch.randn(8, 64)
    for o, n in ((opt, net), (opt2, twin)):
        for _ in range(2):
            o.zero_grad()
            n(x).pow(2).mean().backward()
            o.step()
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_bad_storage_is_a_usage_error():
    w = torch.nn.Parameter(torch.zeros(10))
    with pytest.raises(ft.UsageError, match="has no state 'mm'"):
        ft.Optimizer([w], state_storage={"mm": "q8"})
    with pytest.raises(ft.UsageError, match="unknown storage 'q5'"):
        ft.Optimizer([w], state_storage="q5")
    with pytest.raises(ft.UsageError, match="state_storage is 3"):
        ft.Optimizer([w], state_storage=3)


def test_stochastic_rounding_keeps_bf16_training_moving(seed):
    """bf16 params without masters: an update below half a bf16 ulp is lost to
    round-to-nearest and kept on average by stochastic rounding; a seed gives the same bits."""
    def run(**kw):
        p = torch.nn.Parameter(torch.ones(100000, dtype=torch.bfloat16))
        opt = ft.Optimizer([p], rule="sgd", lr=1e-3, **kw)
        for _ in range(10):
            p.grad = -torch.ones_like(p)  # each step adds 1e-3: an eighth of bf16's ulp at 1
            opt.step()
        return p.detach().float()
    nearest = run()
    stochastic = run(stochastic_rounding=True, seed=seed)
    again = run(stochastic_rounding=True, seed=seed)
    assert torch.equal(nearest, torch.ones_like(nearest))  # every update lost
    assert torch.equal(stochastic, again)
    # The mean moved by 10 * 1e-3 (within 4 standard errors of the rounding noise).
    err = stochastic.mean().item() - 1.01
    se = stochastic.std().item() / (stochastic.numel() ** 0.5)
    print(f"bf16 sgd, 10 steps of +1e-3 from 1.0: mean {stochastic.mean().item():.6f} "
          f"(want 1.01, standard error {se:.2e}); round-to-nearest 1.0")
    assert abs(err) <= 4 * se + 1e-6
