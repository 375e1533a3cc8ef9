"""Loading quantized states from PyTorch: a state dict records each quantized state's storage
and block beside its codes and absmax, and load_state_dict and edits of opt.state hand them to
the one check of a loaded state (the C++ library's, which Optimizer::load runs too): another
storage, block or quant_min_numel, codes of another dtype, an absmax below 0 or not finite,
and a block of absmax 0 under codes of other values are refused, changing nothing. torch.optim
given a quantized state dict fails at its first step instead of stepping on codes."""
import copy
import math
import re

import pytest
import torch

import fusedopt
import fusedopt.torch as ft

SHAPES = [(64, 128), (1000,), (8, 8)]  # 8192 elements: quantized; 1000 and 64: not (4096)
BLOCK = 256
Q8 = {"m": "q8s", "v": "q8u"}  # adamw's m takes any sign; its v is a sum of squares


def stepped(seed, steps=3, rule="adamw", zero_block=None, **options):
    """An optimizer over fresh params stepped `steps` times (block `zero_block` of param 0 never
    given a gradient), its params, and a twin of them."""
    torch.manual_seed(seed)
    ps = [torch.randn(s, requires_grad=True) for s in SHAPES]
    opt = ft.Optimizer(ps, rule=rule, lr=1e-2, **options)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn_like(p)
        if zero_block is not None:
            ps[0].grad.view(-1)[zero_block * BLOCK:(zero_block + 1) * BLOCK] = 0
        opt.step()
    return opt, ps, [p.detach().clone().requires_grad_() for p in ps]


def snapshot(opt):
    return {id(p): {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)}
            for p, s in opt.state.items()}


def _re(text):
    return re.escape(text)


def same(a, b):
    return a.keys() == b.keys() and all(
        a[p].keys() == b[p].keys() and all(torch.equal(a[p][k], b[p][k]) for k in a[p])
        for p in a)


def test_a_quantized_state_dict_records_its_storage_and_round_trips(seed):
    opt, ps, qs = stepped(seed, state_storage=Q8)
    saved = copy.deepcopy(opt.state_dict())
    entry = saved["state"][0]
    assert entry["exp_avg"]["storage"] == "q8s" and entry["exp_avg_sq"]["storage"] == "q8u"
    assert entry["exp_avg"]["block"] == BLOCK and "exp_avg.absmax" not in entry
    assert entry["exp_avg"]["codes"].dtype == torch.uint8
    assert entry["exp_avg"]["absmax"].shape == (math.ceil(8192 / BLOCK),)
    assert saved["state"][1]["exp_avg"].dtype == torch.float32  # 1000 elements: values
    other = ft.Optimizer(qs, rule="adamw", lr=1e-2, state_storage=Q8)
    other.load_state_dict(saved)
    for p, q in zip(ps, qs):
        g = torch.randn_like(p)
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    other.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)


@pytest.mark.parametrize("saved_with, loaded_with, message", [
    (dict(state_storage=Q8), dict(),
     "state 'exp_avg' of parameter 0: it was saved as q8s codes (blocks of 256), this optimizer "
     "keeps it as values (unquantized)"),
    (dict(state_storage=Q8), dict(state_storage="q8s"),
     "state 'exp_avg_sq' of parameter 0: it was saved as q8u codes (blocks of 256), this "
     "optimizer keeps it as q8s codes (blocks of 256) (codes of another map"),
    (dict(state_storage="q4u"), dict(state_storage="q4s"),
     "state 'exp_avg' of parameter 0: it was saved as q4u codes (blocks of 128), this "
     "optimizer keeps it as q4s codes"),
    (dict(state_storage=Q8), dict(state_storage=Q8, quant_block=128),
     "state 'exp_avg' of parameter 0: it was saved as q8s codes (blocks of 256), this "
     "optimizer keeps it as q8s codes (blocks of 128)"),
    (dict(state_storage=Q8), dict(state_storage=Q8, quant_min_numel=1000),
     "state 'exp_avg' of parameter 1: it was saved as values (unquantized), this optimizer "
     "keeps it as q8s codes"),
    (dict(state_storage=Q8), dict(state_storage=Q8, quant_min_numel=10000),
     "state 'exp_avg' of parameter 0: it was saved as q8s codes (blocks of 256), this optimizer "
     "keeps it as values"),
    (dict(), dict(state_storage=Q8),
     "state 'exp_avg' of parameter 0: it was saved as values (unquantized), this optimizer "
     "keeps it as q8s codes"),
])
def test_another_storage_block_or_quant_min_numel_is_refused(seed, saved_with, loaded_with,
                                                            message):
    opt, _, qs = stepped(seed, **saved_with)
    other = ft.Optimizer(qs, rule="adamw", lr=1e-2, **loaded_with)
    for q in qs:
        q.grad = torch.randn_like(q)
    other.step()
    before = snapshot(other)
    with pytest.raises(fusedopt.UsageError, match="load_state_dict: " + _re(message)):
        other.load_state_dict(opt.state_dict())
    assert same(snapshot(other), before)


@pytest.mark.parametrize("codes, shown", [
    (lambda c: c.to(torch.int64) + 256, "its codes are 8192 I64"),
    (lambda c: c.to(torch.float32) + 0.5, "its codes are 8192 F32"),
    (lambda c: c.to(torch.int8), "its codes are 8192 I8"),
])
def test_codes_of_another_dtype_are_refused(seed, codes, shown):
    opt, _, qs = stepped(seed, state_storage=Q8)
    saved = copy.deepcopy(opt.state_dict())
    record = saved["state"][0]["exp_avg"]
    record["codes"] = codes(record["codes"])
    other = ft.Optimizer(qs, rule="adamw", lr=1e-2, state_storage=Q8)
    with pytest.raises(fusedopt.UsageError, match=_re(shown) + ".*q8s codes of 8192 elements are "
                       "8192 U8"):
        other.load_state_dict(saved)
    # The same codes set into opt.state: refused at the next step, nothing changed.
    p = opt.param_groups[0]["params"][0]
    before = snapshot(opt)
    opt.state[p]["exp_avg"] = record["codes"].view(p.shape)
    for q in opt.param_groups[0]["params"]:
        q.grad = torch.randn_like(q)
    params = [q.detach().clone() for q in opt.param_groups[0]["params"]]
    with pytest.raises(fusedopt.UsageError, match=_re(
            "opt.state of param_groups[0]['params'][0]: state 'exp_avg': " + shown)):
        opt.step()
    assert all(torch.equal(q, b) for q, b in zip(opt.param_groups[0]["params"], params))
    assert same({k: v for k, v in snapshot(opt).items() if k != id(p)},
                {k: v for k, v in before.items() if k != id(p)})


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), -float("inf")])
def test_an_absmax_below_0_or_not_finite_is_refused(seed, value):
    opt, ps, qs = stepped(seed, state_storage=Q8)
    saved = copy.deepcopy(opt.state_dict())
    saved["state"][0]["exp_avg_sq"]["absmax"][3] = value
    other = ft.Optimizer(qs, rule="adamw", lr=1e-2, state_storage=Q8)
    shown = {"-1.0": "-1", "nan": "nan", "inf": "inf", "-inf": "-inf"}[str(value)]
    message = (f"state 'exp_avg_sq' of parameter 0: the absmax of block 3 (elements {3 * BLOCK} "
               f"to {4 * BLOCK - 1}) is {shown}")
    with pytest.raises(fusedopt.UsageError, match="load_state_dict: " + _re(message)):
        other.load_state_dict(saved)
    # As an edit of opt.state: refused at the step, which changes nothing.
    bad = opt.state[ps[0]]["exp_avg_sq.absmax"].clone()
    bad[3] = value
    opt.state[ps[0]]["exp_avg_sq.absmax"] = bad
    before = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.randn_like(p)
    with pytest.raises(fusedopt.UsageError, match=_re(
            "opt.state of param_groups[0]['params'][0]: state 'exp_avg_sq': the absmax of block "
            f"3 (elements {3 * BLOCK} to {4 * BLOCK - 1}) is {shown}")):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(ps, before))


def test_an_absmax_of_0_loads_only_over_the_codes_of_0(seed):
    # Block 2 of param 0 never sees a gradient: its m and v are 0 there, stored as absmax 0
    # over the code of 0, and load like any other block.
    opt, ps, qs = stepped(seed, state_storage=Q8, zero_block=2)
    saved = copy.deepcopy(opt.state_dict())
    assert float(saved["state"][0]["exp_avg"]["absmax"][2]) == 0.0
    other = ft.Optimizer(qs, rule="adamw", lr=1e-2, state_storage=Q8)
    other.load_state_dict(copy.deepcopy(saved))
    for p, q in zip(ps, qs):
        g = torch.randn_like(p)
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    other.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    # Block 5's absmax set to 0 over codes of other values; a code changed in block 2.
    for state, edit, message in (
            ("exp_avg_sq", lambda r: r["absmax"].__setitem__(5, 0.0), "block 5 has absmax 0"),
            ("exp_avg", lambda r: r["codes"].view(-1).__setitem__(
                2 * BLOCK + 7, (int(r["codes"].view(-1)[2 * BLOCK]) + 9) % 256),
             f"block 2 has absmax 0 (all its values 0) but element {2 * BLOCK + 7} has code")):
        bad = copy.deepcopy(saved)
        edit(bad["state"][0][state])
        before = snapshot(other)
        with pytest.raises(fusedopt.UsageError,
                           match=_re(f"state '{state}' of parameter 0: {message}")):
            other.load_state_dict(bad)
        assert same(snapshot(other), before)


def test_torch_optim_given_a_quantized_state_dict_fails_at_its_first_step(seed):
    opt, _, qs = stepped(seed, state_storage=Q8)
    theirs = torch.optim.AdamW(qs, lr=1e-2)
    theirs.load_state_dict(opt.state_dict())  # torch checks no state at load
    for q in qs:
        q.grad = torch.randn_like(q)
    with pytest.raises((AttributeError, TypeError, RuntimeError)):
        theirs.step()  # a dict where torch expects a tensor: no step on codes as values
    sgd, _, rs = stepped(seed, rule="sgd", state_storage="q8", momentum=0.9)
    theirs = torch.optim.SGD(rs, lr=1e-2, momentum=0.9)
    theirs.load_state_dict(sgd.state_dict())
    for r in rs:
        r.grad = torch.randn_like(r)
    with pytest.raises((AttributeError, TypeError, RuntimeError)):
        theirs.step()


def test_a_state_dict_of_codes_without_their_record_is_refused(seed):
    opt, ps, qs = stepped(seed, state_storage=Q8)
    saved = copy.deepcopy(opt.state_dict())
    entry = saved["state"][0]
    record = entry["exp_avg"]
    entry["exp_avg"], entry["exp_avg.absmax"] = record["codes"], record["absmax"]
    for loaded_with in (dict(state_storage=Q8), dict()):
        other = ft.Optimizer(copy.deepcopy(qs), rule="adamw", lr=1e-2, **loaded_with)
        with pytest.raises(fusedopt.UsageError, match=_re(
                "state 'exp_avg' of parameter 0 is codes with 'exp_avg.absmax' beside them but "
                "no record of their storage")):
            other.load_state_dict(saved)
    entry["exp_avg"] = dict(record, extra=1)
    with pytest.raises(fusedopt.UsageError, match="is a dict with keys"):
        ft.Optimizer(qs, rule="adamw", lr=1e-2, state_storage=Q8).load_state_dict(saved)
