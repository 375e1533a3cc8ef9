"""torch.optim's contract, as torch 2.x defines it, kept by fusedopt.torch.Optimizer: torch's
range checks (exception type, message and order), opt.state[p]['step'] present and live, the
step and state-dict hooks, a tensor lr and the LR schedulers that set one, training a
torch.compile'd model and compiling the step itself. Each against torch.optim's own class on
the same fresh data where there is one.
"""
import math

import pytest
import torch

import fusedopt
import fusedopt.torch as ft

TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])


def needs_torch(version, what):
    return pytest.mark.skipif(TORCH < version, reason=f"{what} needs torch >= "
                              f"{'.'.join(map(str, version))}; this is torch {torch.__version__}")


# (preset, torch class, hypers torch refuses). Each is refused by both, with the same type
# and message.
REFUSED = [
    ("adadelta", "Adadelta", dict(rho=1.1)),
    ("adagrad", "Adagrad", dict(lr_decay=-0.5)),
    ("adagrad", "Adagrad", dict(initial_accumulator_value=-1.0)),
    ("nadam", "NAdam", dict(momentum_decay=-0.2)),
    ("rprop", "Rprop", dict(etas=(1.0, 0.5))),
    ("rmsprop", "RMSprop", dict(alpha=-0.1)),
    ("sgd", "SGD", dict(lr=1e-2, nesterov=True)),
    ("sgd", "SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1, nesterov=True)),
    ("sgd", "SGD", dict(lr=-1.0)),
    ("asgd", "ASGD", dict(lambd=-1.0)),
    ("adam", "Adam", dict(betas=(0.9, 1.0))),
    ("adamw", "AdamW", dict(eps=-1.0)),
    ("radam", "RAdam", dict(weight_decay=-1.0)),
    ("adamax", "Adamax", dict(betas=(-0.1, 0.9))),
]


@pytest.mark.parametrize("preset,cls,hypers", REFUSED,
                         ids=[f"{c}-{'-'.join(h)}" for _, c, h in REFUSED])
def test_what_torch_refuses_is_refused_with_its_exception(preset, cls, hypers):
    p = torch.zeros(3, requires_grad=True)
    try:
        getattr(torch.optim, cls)([p], **hypers)
        pytest.skip(f"torch {torch.__version__}'s {cls} accepts {hypers} (these are torch "
                    "2.x's checks)")
    except Exception as e:
        theirs = e
    with pytest.raises(type(theirs)) as ours:
        ft.Optimizer([p], rule=preset, **hypers)
    assert str(ours.value) == str(theirs)


def test_adafactor_ranges_as_torch_checks_them():
    p = torch.zeros(3, 4, requires_grad=True)
    for hypers in (dict(beta2_decay=0.5), dict(eps=(-1.0, 1e-3)), dict(eps=(None, -1.0)),
                   dict(d=0.5), dict(lr=-1.0), dict(weight_decay=-1.0)):
        with pytest.raises(ValueError) as ours:
            ft.Optimizer([p], rule="adafactor", **hypers)
        if hasattr(torch.optim, "Adafactor"):
            with pytest.raises(ValueError) as theirs:
                torch.optim.Adafactor([p], **hypers)
            assert str(ours.value) == str(theirs.value)


def test_the_range_check_comes_before_the_params_check_as_in_torch():
    with pytest.raises(ValueError, match="Invalid momentum value: -0.5"):
        torch.optim.SGD(None, lr=1e-2, momentum=-0.5)
    with pytest.raises(ValueError, match="Invalid momentum value: -0.5"):
        ft.Optimizer(None, rule="sgd", lr=1e-2, momentum=-0.5)
    with pytest.raises(TypeError):  # the params, once the hypers pass
        ft.Optimizer(None, rule="sgd", lr=1e-2)


def test_state_step_is_present_and_live(seed):
    p = torch.randn(5, 4, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    ours = ft.Optimizer([p], rule="adamw", lr=1e-2)
    theirs = torch.optim.AdamW([q], lr=1e-2)
    for k in range(1, 4):
        g = torch.randn_like(p)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        step = ours.state[p]["step"]
        assert isinstance(step, torch.Tensor) and step.numel() == 1
        assert float(step) == float(theirs.state[q]["step"]) == k
    held = ours.state[p]["step"]
    p.grad = torch.randn_like(p)
    ours.step()
    assert float(held) == 4  # the same tensor, counting on (torch's is updated in place too)
    # Setting it sets the count, as in torch (where the next step reads it).
    ours.state[p]["step"] = torch.tensor(100.0)
    p.grad = torch.randn_like(p)
    ours.step()
    assert float(ours.state[p]["step"]) == 101
    assert ours.state_dict()["state"][0]["step"].item() == 101


@needs_torch((2, 0), "torch.optim's step and state-dict hooks")
def test_step_and_state_dict_hooks_run_as_in_torch():
    p = torch.randn(4, requires_grad=True)
    opt = ft.Optimizer([p], rule="sgd", lr=0.1)
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", o is opt)))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append(("post", o is opt)))
    p.grad = torch.ones(4)
    opt.step()
    assert calls == [("pre", True), ("post", True)]
    if not hasattr(opt, "register_state_dict_pre_hook"):
        return
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append("sd pre"))

    def sd_post(o, sd):
        seen.append("sd post")
        sd["extra"] = 1
        return sd
    opt.register_state_dict_post_hook(sd_post)

    def load_pre(o, sd):
        seen.append(("load pre", sd.get("extra")))
        sd = dict(sd)
        sd.pop("extra")
        return sd
    opt.register_load_state_dict_pre_hook(load_pre)
    opt.register_load_state_dict_post_hook(lambda o: seen.append("load post"))
    sd = opt.state_dict()
    assert sd["extra"] == 1
    opt.load_state_dict(sd)
    assert seen == ["sd pre", "sd post", ("load pre", 1), "load post"]


@needs_torch((2, 2), "a tensor lr")
def test_a_tensor_lr_and_a_scheduler_that_sets_it_step_as_torch(seed):
    p = torch.randn(6, 3, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    ours = ft.Optimizer([p], rule="adamw", lr=torch.tensor(0.02))
    theirs = torch.optim.AdamW([q], lr=torch.tensor(0.02))
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (ours, theirs)]
    for _ in range(6):
        g = torch.randn_like(p)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        for s in scheds:
            s.step()
    assert isinstance(ours.param_groups[0]["lr"], torch.Tensor)
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@needs_torch((2, 1), "torch.compile")
def test_a_compiled_model_trains_and_a_compiled_step_runs(seed):
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="eager")
    ours = ft.Optimizer(model.parameters(), rule="adamw", lr=1e-2)
    theirs = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    step = torch.compile(ours.step, backend="eager")  # our call is a graph break
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for k in range(5):
        for m, o in ((compiled, ours), (ref, theirs)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
        (step if k % 2 else ours.step)()
        theirs.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert math.isfinite(float(ours.state[model[0].weight]["step"]))


def test_sparse_grads_are_refused_naming_the_param():
    p = torch.randn(10, 3, requires_grad=True)
    p.grad = torch.sparse_coo_tensor([[1, 4]], torch.ones(2, 3), (10, 3))
    opt = ft.Optimizer([p], rule="sgd", lr=0.1)
    with pytest.raises(fusedopt.UsageError, match=r"params'\]\[0\].*sparse"):
        opt.step()


def _train_both(ours_params, theirs_params, ours, theirs, steps=6, grads=None):
    for _ in range(steps):
        for p, q in zip(ours_params, theirs_params):
            g = torch.randn_like(q) if grads is None else grads(q)
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()


@pytest.mark.parametrize("rule,cls", [("adamw", "AdamW"), ("sgd", "SGD"), ("lamb", None)])
def test_non_contiguous_params_and_grads_step_in_place_as_torch(rule, cls, seed):
    base = torch.randn(8, 6)
    p = torch.nn.Parameter(base.t())  # a transposed view: strides (1, 6)
    assert not p.is_contiguous()
    q = torch.nn.Parameter(base.t().contiguous())
    kw = dict(lr=1e-2) if rule != "sgd" else dict(lr=1e-2, momentum=0.9)
    ours = ft.Optimizer([p], rule=rule, **kw)
    theirs = getattr(torch.optim, cls)([q], **kw) if cls else ft.Optimizer([q], rule=rule, **kw)
    storage = p.data_ptr()

    def grads(q):  # non-contiguous grads too (an expanded row, a transposed matrix)
        return torch.randn(q.shape[1], q.shape[0]).t()
    _train_both([p], [q], ours, theirs, grads=grads)
    assert p.data_ptr() == storage and p.stride() == (1, 6)  # stepped in place
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    # And a grad that turns non-contiguous after the first plan is followed.
    p.grad = torch.randn(8, 6).t()
    q.grad = p.grad.clone()
    ours.step()
    theirs.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rule,cls", [("adamw", "AdamW"), ("adam", "Adam"), ("sgd", "SGD"),
                                      ("rmsprop", "RMSprop")])
def test_complex_params_step_as_torch(rule, cls, seed):
    p = torch.nn.Parameter(torch.randn(5, 4, dtype=torch.complex64))
    q = torch.nn.Parameter(p.detach().clone())
    kw = dict(lr=1e-2, momentum=0.9) if rule == "sgd" else dict(lr=1e-2)
    ours = ft.Optimizer([p], rule=rule, **kw)
    theirs = getattr(torch.optim, cls)([q], **kw)
    _train_both([p], [q], ours, theirs)
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    for key, value in theirs.state[q].items():
        if key != "step":
            assert ours.state[p][key].dtype == value.dtype  # complex, as torch keeps them
            torch.testing.assert_close(ours.state[p][key], value, rtol=1e-5, atol=1e-6)
    # torch's state dict loads into fusedopt and back.
    again = ft.Optimizer([p], rule=rule, **kw)
    again.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(again.state_dict()["state"][0][key], value)


@pytest.mark.parametrize("rule,cls,kw", [("adamw", "AdamW", dict(lr=1e-2)),
                                         ("sgd", "SGD", dict(lr=1e-2, momentum=0.9)),
                                         ("adam", "Adam", dict(lr=1e-2, weight_decay=0.1))])
def test_float64_params_step_in_double_as_torch(rule, cls, kw, seed):
    p = torch.nn.Parameter(torch.randn(7, 5, dtype=torch.float64))
    q = torch.nn.Parameter(p.detach().clone())
    small = torch.nn.Parameter(torch.randn(3))  # a float32 param beside it: a binding each
    ours = ft.Optimizer([p, small], rule=rule, **kw)
    theirs = getattr(torch.optim, cls)([q], **kw)
    for _ in range(8):
        g = torch.randn_like(q)
        p.grad, q.grad, small.grad = g.clone(), g.clone(), torch.randn(3)
        ours.step()
        theirs.step()
    # Within float64 rounding (fp32 math would be ~1e-7 away).
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-13)
    for key, value in theirs.state[q].items():
        if key != "step":
            assert ours.state[p][key].dtype == torch.float64
            torch.testing.assert_close(ours.state[p][key], value, rtol=1e-12, atol=1e-13)
    again = ft.Optimizer([p, small], rule=rule, **kw)
    again.load_state_dict(ours.state_dict())
    assert again.state_dict()["state"][0][key].dtype == torch.float64


def test_float64_params_under_a_rule_with_reductions_are_a_clear_error():
    p = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    p.grad = torch.ones_like(p)
    opt = ft.Optimizer([p], rule="lamb")
    with pytest.raises(fusedopt.UsageError, match="float64|fp64"):
        opt.step()
