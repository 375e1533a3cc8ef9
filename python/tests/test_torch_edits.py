"""What user code does to a fusedopt.torch.Optimizer between steps, against torch.optim doing
the same on the same fresh random data: grads given new memory in place (``.data``,
``set_``, ``nn.Module.share_memory()``), ``opt.state`` edited (cleared, an entry emptied, a
state replaced or deleted, a step set), a param that changes shape; and what it gives the
constructor and its groups: options checked when given, malformed hypers set later, torch's
``amsgrad`` on a rule without that option, empty matrices, a ``fusedopt.Rule`` in an
optimizer that is copied or pickled, 4-bit states of a one-element param; a meta tensor put
in ``opt.state`` (a UsageError).

Tolerance as test_torch_optimizer.py: both sides compute in fp32, |fusedopt - torch| <= 1e-5
* (|torch| + max|torch|) per tensor.
"""
import copy
import pickle

import pytest
import torch

import fusedopt
import fusedopt.torch as ft

RTOL = 1e-5


def close(a, b):
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item() if b.numel() else 0.0
    return bool(((a - b).abs() <= RTOL * (b.abs() + scale)).all())


def twins(shapes):
    ours = [torch.randn(s).requires_grad_() for s in shapes]
    return ours, [p.detach().clone().requires_grad_() for p in ours]


def step_both(ours, theirs, opt, ref, grads=None):
    grads = grads or [torch.randn(p.shape) for p in ours]
    for p, q, g in zip(ours, theirs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    ref.step()


def test_grads_given_new_memory_in_place_are_followed():
    ours, theirs = twins([(7, 5), (13,)])
    opt = ft.Optimizer(ours, rule="sgd", lr=0.1, momentum=0.9)
    ref = torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    step_both(ours, theirs, opt, ref)
    for k in range(4):
        for p, q in zip(ours, theirs):
            g = torch.randn(p.shape)
            if k % 2 == 0:  # the same grad tensor, new memory
                p.grad.data, q.grad.data = g.clone(), g.clone()
            else:
                p.grad.set_(g.clone())
                q.grad.set_(g.clone())
        opt.step()
        ref.step()
        for p, q in zip(ours, theirs):
            assert close(p, q), k


def test_moves_among_50000_tensors_are_followed():
    # The steady step's check runs in one call over every param (fusedopt._fusedopt._Watch):
    # each kind of move, made to one tensor among 50,000, must still be seen.
    n = 50000
    ours, theirs = twins([(3,)] * n)
    opt = ft.Optimizer(ours, rule="sgd", lr=0.1, momentum=0.9)
    ref = torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    grads = [torch.randn(3) for _ in range(n)]
    for p, q, g in zip(ours, theirs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    ref.step()
    gen = torch.Generator().manual_seed(5)
    for k, move in enumerate(["steady", "grad data", "grad set_", "new grad", "param data",
                              "grad dropped", "grad back", "last grad data"]):
        i = n - 1 if move == "last grad data" else int(torch.randint(n, (1,), generator=gen))
        g = torch.randn(3)
        p, q = ours[i], theirs[i]
        if move in ("grad data", "last grad data"):
            p.grad.data, q.grad.data = g.clone(), g.clone()
        elif move == "grad set_":
            p.grad.set_(g.clone())
            q.grad.set_(g.clone())
        elif move == "new grad":
            p.grad, q.grad = g.clone(), g.clone()
        elif move == "param data":
            p.data, q.data = p.data.clone(), q.data.clone()
        elif move == "grad dropped":  # torch skips a param without a grad
            dropped = i
            p.grad = q.grad = None
        elif move == "grad back":
            p, q = ours[dropped], theirs[dropped]
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        assert close(torch.cat([x.detach() for x in ours]),
                     torch.cat([x.detach() for x in theirs])), move


HEAVY_BALL = "param p\ngrad g\nstate m = 0\nhyper lr = 0.1, momentum = 0.9\n" \
             "m = momentum * m + g\np = p - lr * m\n"


def test_a_rule_given_as_text_takes_its_name():
    ours, theirs = twins([(4, 3), (5,)])
    opt = ft.Optimizer(ours, rule=HEAVY_BALL, name="heavy_ball")
    ref = torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    for _ in range(3):
        step_both(ours, theirs, opt, ref)
    assert all(close(p, q) for p, q in zip(ours, theirs))
    assert opt.rule.name == "heavy_ball"
    assert opt.stats()[0]["fusion_report"].startswith("heavy_ball over 2 tensors")
    assert pickle.loads(pickle.dumps(opt)).rule.name == "heavy_ball"
    assert ft.Optimizer(twins([(3,)])[0], rule=HEAVY_BALL).rule.name == "<rule>"
    with pytest.raises(fusedopt.RuleError) as e:
        ft.Optimizer(twins([(3,)])[0], rule=HEAVY_BALL.replace("m = momentum", "m = momentm"),
                     name="heavy_ball")
    assert e.value.file == "heavy_ball.rule" and e.value.line == 5, str(e.value)


@pytest.mark.parametrize("rule, name, message", [
    (HEAVY_BALL, "a/b", "a rule's name is a non-empty word"),
    (HEAVY_BALL, "", "a rule's name is a non-empty word"),
    (HEAVY_BALL, "v1.2", "a rule's name is a non-empty word"),
    ("adamw", "mine", "a preset keeps its own name"),
])
def test_bad_rule_names_are_refused(rule, name, message):
    with pytest.raises(fusedopt.UsageError, match=message):
        ft.Optimizer(twins([(3,)])[0], rule=rule, name=name)


def test_module_share_memory_with_kept_grads():
    m = torch.nn.Linear(6, 3)
    m2 = copy.deepcopy(m)
    x = torch.randn(9, 6)
    opt = ft.Optimizer(m.parameters(), rule="adamw", lr=0.01)
    ref = torch.optim.AdamW(m2.parameters(), lr=0.01)
    for step in range(4):
        for mod, o in ((m, opt), (m2, ref)):
            o.zero_grad(set_to_none=False)  # grads kept: _apply moves them with .data
            mod(x).pow(2).sum().backward()
            o.step()
        if step == 1:
            m.share_memory()
            m2.share_memory()
    for a, b in zip(m.parameters(), m2.parameters()):
        assert close(a, b)


@pytest.mark.parametrize("edit", ["clear", "empty", "delete_entry", "new_table"])
def test_state_reset_starts_again(edit):
    ours, theirs = twins([(11, 3), (5,)])
    opt = ft.Optimizer(ours, rule="adam", lr=0.05)
    ref = torch.optim.Adam(theirs, lr=0.05)
    for _ in range(3):
        step_both(ours, theirs, opt, ref)
    for o, params in ((opt, ours), (ref, theirs)):
        if edit == "clear":
            o.state.clear()
        elif edit == "empty":
            o.state[params[0]] = {}
        elif edit == "delete_entry":
            del o.state[params[0]]
        else:
            o.state = type(o.state)(dict) if edit == "new_table" and o is ref else {}
    for _ in range(2):
        step_both(ours, theirs, opt, ref)
    for p, q in zip(ours, theirs):
        assert close(p, q)
        for key in ("exp_avg", "exp_avg_sq"):
            assert close(opt.state[p][key], ref.state[q][key])
    saved = opt.state_dict()["state"]
    assert [saved[i]["step"].item() for i in (0, 1)] == \
        [ref.state[q]["step"].item() for q in theirs]


def test_a_state_replaced_or_deleted_or_a_step_set():
    ours, theirs = twins([(6, 4)])
    opt = ft.Optimizer(ours, rule="adam", lr=0.05)
    ref = torch.optim.Adam(theirs, lr=0.05)
    step_both(ours, theirs, opt, ref)
    new = torch.randn(6, 4)
    opt.state[ours[0]]["exp_avg"] = new.clone()
    ref.state[theirs[0]]["exp_avg"] = new.clone()
    opt.state[ours[0]]["step"] = torch.tensor(7.0)
    ref.state[theirs[0]]["step"] = torch.tensor(7.0)
    step_both(ours, theirs, opt, ref)
    assert close(ours[0], theirs[0])
    assert close(opt.state[ours[0]]["exp_avg"], ref.state[theirs[0]]["exp_avg"])
    assert opt.state_dict()["state"][0]["step"].item() == 8
    # A deleted state starts from its initial value (zeros), the others go on.
    del opt.state[ours[0]]["exp_avg_sq"]
    ref.state[theirs[0]]["exp_avg_sq"] = torch.zeros(6, 4)
    step_both(ours, theirs, opt, ref)
    assert close(ours[0], theirs[0])
    assert close(opt.state[ours[0]]["exp_avg_sq"], ref.state[theirs[0]]["exp_avg_sq"])


def test_a_bad_state_edit_is_refused_and_changes_nothing():
    ours, theirs = twins([(6, 4)])
    opt = ft.Optimizer(ours, rule="adam", lr=0.05)
    ref = torch.optim.Adam(theirs, lr=0.05)
    step_both(ours, theirs, opt, ref)
    kept = opt.state[ours[0]]["exp_avg"]
    opt.state[ours[0]]["exp_avg"] = torch.zeros(4, 6)
    ours[0].grad = torch.randn(6, 4)
    with pytest.raises(fusedopt.UsageError, match=r"opt.state of param_groups\[0\]\['params'\]"
                       r"\[0\].*'exp_avg' has shape \(4, 6\)"):
        opt.step()
    opt.state[ours[0]]["exp_avg"] = kept  # put back: the optimizer goes on as before
    step_both(ours, theirs, opt, ref)
    assert close(ours[0], theirs[0])


@pytest.mark.parametrize("key", ["exp_avg", "step"])
def test_a_meta_tensor_in_opt_state_is_a_usage_error(key):
    # A meta tensor holds no values: torch raised its NotImplementedError copying one.
    ours, theirs = twins([(6, 4)])
    opt = ft.Optimizer(ours, rule="adam", lr=0.05)
    ref = torch.optim.Adam(theirs, lr=0.05)
    step_both(ours, theirs, opt, ref)
    kept = opt.state[ours[0]][key]
    opt.state[ours[0]][key] = torch.empty(kept.shape, device="meta")
    ours[0].grad = torch.randn(6, 4)
    with pytest.raises(fusedopt.UsageError, match=r"opt.state of param_groups\[0\]\['params'\]"
                       r"\[0\].*a tensor on the meta device"):
        opt.step()
    opt.state[ours[0]][key] = kept  # put back: nothing changed
    step_both(ours, theirs, opt, ref)
    assert close(ours[0], theirs[0])


def test_a_param_that_changes_shape_is_named_and_a_reset_recovers():
    p = torch.randn(4, 3, requires_grad=True)
    opt = ft.Optimizer([p], rule="adafactor")
    p.grad = torch.randn(4, 3)
    opt.step()
    p.data = torch.randn(3, 4)
    p.grad = torch.randn(3, 4)
    with pytest.raises(fusedopt.UsageError, match=r"shape changed from \(4, 3\) to \(3, 4\)"):
        opt.step()
    opt.state[p] = {}
    q = p.detach().clone().requires_grad_()
    q.grad = p.grad.clone()
    fresh = ft.Optimizer([q], rule="adafactor")
    opt.step()
    fresh.step()
    assert torch.equal(p, q)


def test_empty_matrices_step_as_torch():
    ours, theirs = twins([(0, 5), (5, 0), (4, 3)])
    opt = ft.Optimizer(ours, rule="adamw", lr=0.1)
    ref = torch.optim.AdamW(theirs, lr=0.1)
    for _ in range(2):
        step_both(ours, theirs, opt, ref)
    for p, q in zip(ours, theirs):
        assert p.shape == q.shape and close(p, q)


def test_copies_and_pickles_with_a_rule_object():
    rule = fusedopt.Rule.parse("param p\ngrad g\nhyper lr = 0.1\nstate m = 0\n"
                               "m = 0.9 * m + g\np = p - lr * m\n", "momentum.rule")
    for given in (rule, rule.with_grad_clipping(0.5)):
        p = torch.randn(8, requires_grad=True)
        opt = ft.Optimizer([p], rule=given)
        p.grad = torch.randn(8)
        opt.step()
        copies = [copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))]
        g = torch.randn(8)
        for o in [opt] + copies:
            o.param_groups[0]["params"][0].grad = g.clone()
            o.step()
        for o in copies:
            assert o.rule.name == given.name and o.rule.text == given.text
            assert torch.equal(o.param_groups[0]["params"][0], p)


@pytest.mark.parametrize("options, message", [
    (dict(seed=2**64), "seed is 18446744073709551616"),
    (dict(seed=1.5), "seed is 1.5"),
    (dict(quant_block=3), "quant_block is 3: a power of two"),
    (dict(quant_block=2**31), "quant_block is 2147483648"),
    (dict(quant_min_numel=-1), "quant_min_numel is -1"),
    (dict(reduction_strategy="fast"), "reduction strategy 'fast'"),
    (dict(max_grad_norm=-1.0), "max_grad_norm is -1"),
    (dict(state_dtype="fp64"), "unsupported state_dtype fp64"),
    (dict(master_weights=True, stochastic_rounding=True), "choose one"),
    (dict(amsgrad=True), "rule 'adamw8bit' has no amsgrad option"),
])
def test_bad_options_are_refused_when_given(options, message):
    p = torch.randn(5, requires_grad=True)
    with pytest.raises(fusedopt.UsageError, match=message.replace("(", r"\(")):
        ft.Optimizer([p], rule="adamw8bit", **options)


def test_negative_seeds_and_amsgrad_false_are_taken():
    p = torch.randn(5, requires_grad=True)
    ft.Optimizer([p], rule="lion", seed=-1, amsgrad=False)
    opt = ft.Optimizer([p], rule="adamw")
    with pytest.raises(fusedopt.UsageError, match="amsgrad picks the rule"):
        opt.add_param_group({"params": [torch.randn(3, requires_grad=True)], "amsgrad": True})


@pytest.mark.parametrize("key, value, message", [
    ("betas", 0.5, r"hyper 'betas' is 0.5; it must be a tuple of 2"),
    ("betas", (0.5,), r"hyper 'betas' is \(0.5,\); it must be a tuple of 2"),
    ("lr", None, r"hyper 'lr' is None"),
    ("lr", "0.1", r"hyper 'lr' is '0.1'"),
])
def test_malformed_hypers_set_later_name_their_group(key, value, message):
    a, b = torch.randn(3, requires_grad=True), torch.randn(4, requires_grad=True)
    opt = ft.Optimizer([{"params": [a]}, {"params": [b]}], rule="adam", lr=0.1)
    a.grad, b.grad = torch.randn(3), torch.randn(4)
    opt.step()
    before = (a.detach().clone(), b.detach().clone())
    opt.param_groups[1][key] = value
    with pytest.raises(fusedopt.UsageError, match="param group 1: " + message):
        opt.step()
    assert torch.equal(a, before[0]) and torch.equal(b, before[1])


@pytest.mark.parametrize("shape", [(), (1, 1), (1,), (3,)])
def test_four_bit_states_of_tiny_params_reload(shape):
    p = torch.randn(shape, requires_grad=True)
    opt = ft.Optimizer([p], rule="adamw4bit", quant_min_numel=1)
    p.grad = torch.randn(shape)
    opt.step()
    q = p.detach().clone().requires_grad_()
    other = ft.Optimizer([q], rule="adamw4bit", quant_min_numel=1)
    other.load_state_dict(opt.state_dict())
    g = torch.randn(shape)
    p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    other.step()
    assert torch.equal(p, q)


def test_negated_views_are_refused():
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.ones(3)._neg_view()
    with pytest.raises(fusedopt.UsageError, match="its gradient is a lazily negated view"):
        ft.Optimizer([p], rule="sgd", lr=1.0).step()


def test_a_checkpoint_with_other_state_names_lists_them():
    p = torch.randn(4, 3, requires_grad=True)
    opt = ft.Optimizer([p], rule="adamw")
    p.grad = torch.randn(4, 3)
    opt.step()
    other = ft.Optimizer([torch.randn(4, 3, requires_grad=True)], rule="adamw8bit",
                         quant_min_numel=1)
    with pytest.raises(fusedopt.UsageError, match=r"it has 'exp_avg', 'exp_avg_sq', step 1\).*"
                       r"it keeps 'm', 'm.absmax', 'v', 'v.absmax'"):
        other.load_state_dict(opt.state_dict())


def test_a_param_group_added_later_under_clipping_joins_with_a_step_count():
    ours, theirs = twins([(4, 3), (5,)])
    opt = ft.Optimizer(ours[:1], rule="adamw", lr=0.05, max_grad_norm=1.0)
    ref = torch.optim.AdamW(theirs[:1], lr=0.05)

    def step(n):
        for p, q in zip(ours[:n], theirs[:n]):
            g = torch.randn(p.shape)
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        torch.nn.utils.clip_grad_norm_(theirs[:n], 1.0)
        ref.step()

    step(1)
    step(1)
    opt.add_param_group({"params": [ours[1]]})
    ref.add_param_group({"params": [theirs[1]]})
    ours[1].grad = torch.randn(5)
    with pytest.raises(fusedopt.UsageError, match=r"different numbers of steps \(0, 2\).*"
                       r"opt.state\[p\]\['step'\] = N"):
        opt.step()
    opt.state[ours[1]]["step"] = 2
    ref.state[theirs[1]] = {"step": torch.tensor(2.0), "exp_avg": torch.zeros(5),
                            "exp_avg_sq": torch.zeros(5)}  # the same: count 2, zero moments
    step(2)
    step(2)
    for p, q in zip(ours, theirs):
        assert close(p, q)


@pytest.mark.parametrize("when", ["after_load", "without_grad_last_step", "after_copy"])
def test_a_reset_of_a_param_outside_the_kernels_starts_it_again(when):
    ours, theirs = twins([(6, 4), (5,)])
    opt = ft.Optimizer(ours, rule="adam", lr=0.05)
    ref = torch.optim.Adam(theirs, lr=0.05)
    for _ in range(3):
        step_both(ours, theirs, opt, ref)
    if when == "after_load":
        opt.load_state_dict(opt.state_dict())
    elif when == "without_grad_last_step":  # param 0 sits out a step: no kernel holds it
        ours[0].grad, theirs[0].grad = None, None
        g = torch.randn(5)
        ours[1].grad, theirs[1].grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    else:
        opt = copy.deepcopy(opt)
        ours = opt.param_groups[0]["params"]
    opt.state[ours[0]] = {}
    ref.state[theirs[0]] = {}
    for _ in range(2):
        step_both(ours, theirs, opt, ref)
    for p, q in zip(ours, theirs):
        assert close(p, q)
    assert opt.state_dict()["state"][0]["step"].item() == ref.state[theirs[0]]["step"].item()


def test_a_copy_of_opt_state_is_a_plain_table():
    p = torch.randn(3, requires_grad=True)
    opt = ft.Optimizer([p], rule="adam")
    p.grad = torch.randn(3)
    opt.step()
    for table in (opt.state.copy(), copy.copy(opt.state), opt.state | {}):
        table[p] = {"exp_avg": torch.zeros(3)}  # writable, and not the optimizer's
    assert not torch.equal(opt.state[p]["exp_avg"], torch.zeros(3))
