"""fusedopt.torch.Optimizer refuses bad input with a clear exception, before it changes anything:
malformed rules, sparse or foreign gradients, unknown hypers, hypers that are no finite fp32
numbers or out of torch's ranges, and a gradient that overlaps another param's memory.
"""
import math

import pytest
import torch

import fusedopt
import fusedopt.torch as ft
from test_torch_optimizer import close, feed, make_params, twin


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
