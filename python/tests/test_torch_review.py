"""A review of fusedopt.torch's front end (the package python/fusedopt/torch/): each test pins one
behaviour that differed from torch.optim's own class on the same fresh data (or from what
docs/python.md promises) when it was written. Each fails on the code it was written against and
passes once that behaviour is fixed.
"""
import warnings

import pytest
import torch

import fusedopt.torch as ft

TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])


def needs_torch(version, what):
    return pytest.mark.skipif(TORCH < version, reason=f"{what} needs torch >= "
                              f"{'.'.join(map(str, version))}; this is torch {torch.__version__}")


def _pair(*shape, dtype=torch.float32):
    p = torch.nn.Parameter(torch.randn(*shape, dtype=dtype))
    return p, torch.nn.Parameter(p.detach().clone())


# ---- opt.state[p]['step'] -------------------------------------------------------------------

def test_an_in_place_edit_of_one_params_step_leaves_the_other_params_steps_alone(seed):
    """torch keeps one step tensor per param: `state[p]['step'] += 10` (an in-place add on a
    tensor) moves p's count only. Here every param of an engine shares one live step view, so
    the edit moved q's count (and its bias correction) too."""
    p, p_ref = _pair(4)
    q, q_ref = _pair(4)
    ours = ft.Optimizer([p, q], rule="adam", lr=0.1)
    theirs = torch.optim.Adam([p_ref, q_ref], lr=0.1)
    for k in range(3):
        for a, b in ((p, p_ref), (q, q_ref)):
            g = torch.randn_like(a)
            a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        if k == 0:
            ours.state[p]["step"] += 10
            theirs.state[p_ref]["step"] += 10
    assert float(ours.state[q]["step"]) == float(theirs.state[q_ref]["step"]) == 3
    assert float(ours.state[p]["step"]) == float(theirs.state[p_ref]["step"]) == 13
    torch.testing.assert_close(q.detach(), q_ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p.detach(), p_ref.detach(), rtol=1e-5, atol=1e-6)


# ---- strides at an unchanged address ----------------------------------------------------------

# (A param's or grad's .data swapped for a view laid otherwise at the same address is not
# followed, as a state tensor's swapped memory is not: docs/python.md.)
@pytest.mark.parametrize("how", ["new grad tensor"])
def test_a_tensor_re_laid_at_the_same_address_steps_as_torch(how, seed):
    """A grad (or param) that becomes a transposed view of the same memory keeps its data_ptr;
    the pointer following compares addresses only, so the kernel kept walking it as the
    contiguous tensor it was bound as (each element paired with the wrong one)."""
    p, q = _pair(4, 4)
    ours = ft.Optimizer([p], rule="adam", lr=0.1)
    theirs = torch.optim.Adam([q], lr=0.1)
    buf = torch.randn(4, 4)
    p.grad, q.grad = buf, buf.clone()
    ours.step()
    theirs.step()
    if how == "param.data":
        p.data = p.data.t()
        q.data = q.data.t()
    for _ in range(2):
        g = torch.randn(4, 4)
        if how == "new grad tensor":  # the same buffer, given transposed
            buf.copy_(g.t())
            p.grad = buf.t()
        elif how == "grad.data":
            p.grad.data = p.grad.data.t()
            p.grad.copy_(g)
        else:
            p.grad = g.clone()
        q.grad = g.clone()
        assert torch.equal(p.grad, g)
        ours.step()
        theirs.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


# ---- load_state_dict ------------------------------------------------------------------------

@needs_torch((2, 2), "a tensor lr")
def test_load_state_dict_does_not_share_a_tensor_lr_with_the_state_dict(seed):
    """torch's load_state_dict deep-copies the saved param groups; here a loaded group took the
    saved tensor lr itself, so a scheduler of one optimizer (which fills a tensor lr in place)
    changed the other's lr (from_torch shares it with the torch optimizer the same way)."""
    p = torch.nn.Parameter(torch.randn(4))
    source = ft.Optimizer([p], rule="adamw", lr=torch.tensor(0.1))
    loaded = ft.Optimizer([p], rule="adamw", lr=torch.tensor(0.5))
    loaded.load_state_dict(source.state_dict())
    sched = torch.optim.lr_scheduler.StepLR(loaded, step_size=1, gamma=0.5)
    p.grad = torch.randn(4)
    loaded.step()
    sched.step()
    assert float(loaded.param_groups[0]["lr"]) == pytest.approx(0.05)
    assert float(source.param_groups[0]["lr"]) == pytest.approx(0.1)  # torch's is untouched
    theirs = torch.optim.AdamW([p], lr=torch.tensor(0.2))
    converted = ft.from_torch(theirs)
    converted.param_groups[0]["lr"].fill_(1.0)
    assert float(theirs.param_groups[0]["lr"]) == pytest.approx(0.2)


@needs_torch((2, 6), "torch.optim.Adam(decoupled_weight_decay=True)")
def test_a_decoupled_adam_checkpoint_is_not_silently_stepped_as_l2_adam(seed):
    """A checkpoint of torch.optim.Adam(decoupled_weight_decay=True) (AdamW's math) loaded into
    rule='adam': torch's Adam then steps decoupled (the group's key decides). Here the key was
    kept in the group but the rule went on with L2 weight decay, with no warning (amsgrad's
    mismatch warns; from_torch switches the preset for this key)."""
    p, q = _pair(6)
    source_param = torch.nn.Parameter(p.detach().clone())
    source = torch.optim.Adam([source_param], lr=0.1, weight_decay=0.5,
                              decoupled_weight_decay=True)
    source_param.grad = torch.randn(6)
    source.step()
    ours = ft.Optimizer([p], rule="adam", lr=0.1, weight_decay=0.5)
    theirs = torch.optim.Adam([q], lr=0.1, weight_decay=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours.load_state_dict(source.state_dict())
    theirs.load_state_dict(source.state_dict())
    if any("decoupled_weight_decay" in str(w.message) for w in caught):
        return  # told, as for amsgrad: fine
    for _ in range(3):
        g = torch.randn(6)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


# ---- complex params with states that are not fp32/fp64 --------------------------------------

@pytest.mark.parametrize("options", [dict(state_dtype=torch.bfloat16),
                                     dict(state_storage="q8", quant_min_numel=16)],
                         ids=["bf16-states", "q8-states"])
def test_complex_params_round_trip_their_own_state_dict(options, seed):
    """A complex param's states show in opt.state (and state_dict) as real pairs, shape
    (..., 2), when they are bf16 or 8-bit codes (only fp32/fp64 views are shown complex), but
    load_state_dict expects the complex param's shape: the optimizer's own state dict was
    refused."""
    p = torch.nn.Parameter(torch.randn(32, 8, dtype=torch.complex64))
    ours = ft.Optimizer([p], rule="adamw", lr=1e-2, **options)
    for _ in range(2):
        p.grad = torch.randn_like(p)
        ours.step()
    p2 = torch.nn.Parameter(p.detach().clone())
    again = ft.Optimizer([p2], rule="adamw", lr=1e-2, **options)
    again.load_state_dict(ours.state_dict())
    for _ in range(2):
        g = torch.randn_like(p)
        p.grad, p2.grad = g.clone(), g.clone()
        ours.step()
        again.step()
    assert torch.equal(p, p2)


def test_a_torch_checkpoint_of_complex_params_loads_with_bfloat16_states(seed):
    """docs/python.md: torch's checkpoints of complex params load; a float32 param's load into
    state_dtype=torch.bfloat16 (converted), a complex one's was refused ('a state is real
    numbers (kept as torch.bfloat16)')."""
    p, q = _pair(5, 4, dtype=torch.complex64)
    theirs = torch.optim.AdamW([q], lr=1e-2)
    for _ in range(2):
        q.grad = torch.randn_like(q)
        theirs.step()
    ours = ft.Optimizer([p], rule="adamw", lr=1e-2, state_dtype=torch.bfloat16)
    ours.load_state_dict(theirs.state_dict())
    exp_avg = ours.state[p]["exp_avg"]
    torch.testing.assert_close(torch.view_as_real(exp_avg.to(torch.complex64))
                               if exp_avg.is_complex() else exp_avg.float(),
                               torch.view_as_real(theirs.state[q]["exp_avg"]),
                               rtol=1e-2, atol=1e-3)


# ---- opt.state[p] stays the dict torch would keep ---------------------------------------------

def test_a_held_state_entry_stays_live_when_the_params_with_grads_change(seed):
    """torch's opt.state[p] is one dict for the param's life (load_state_dict aside): code that
    holds it sees the state as it steps. Here a step whose params with grads differ from the
    last one's (a param skipped) put a new dict in opt.state[p]; the held one kept the old
    values, and writes into its tensors were lost."""
    p, p_ref = _pair(4)
    q, q_ref = _pair(4)
    ours = ft.Optimizer([p, q], rule="adam", lr=0.1)
    theirs = torch.optim.Adam([p_ref, q_ref], lr=0.1)
    for a, b in ((p, p_ref), (q, q_ref)):
        g = torch.randn_like(a)
        a.grad, b.grad = g.clone(), g.clone()
    ours.step()
    theirs.step()
    held, held_ref = ours.state[p], theirs.state[p_ref]
    q.grad = q_ref.grad = None  # q skipped: the next step binds p alone
    g = torch.randn(4)
    p.grad, p_ref.grad = g.clone(), g.clone()
    ours.step()
    theirs.step()
    held["exp_avg"].zero_()
    held_ref["exp_avg"].zero_()
    g = torch.randn(4)
    p.grad, p_ref.grad = g.clone(), g.clone()
    ours.step()
    theirs.step()
    torch.testing.assert_close(p.detach(), p_ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(held["exp_avg"], held_ref["exp_avg"], rtol=1e-5, atol=1e-6)


# ---- add_param_group ------------------------------------------------------------------------

def test_a_refused_param_group_is_not_added(seed):
    """add_param_group refuses a key the rule has no hyper for, but only after torch's
    add_param_group appended the group: the refused group stayed in param_groups and the next
    step stepped its params (optimizer.py's comment: 'a refused group changes nothing')."""
    p, q = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))
    opt = ft.Optimizer([p], rule="adamw", lr=0.1)
    with pytest.raises(ValueError, match="foo"):
        opt.add_param_group({"params": [q], "foo": 1.0})
    assert len(opt.param_groups) == 1
    before = q.detach().clone()
    p.grad, q.grad = torch.randn(4), torch.randn(4)
    opt.step()
    assert torch.equal(q.detach(), before)


# ---- state_dict after an edit of 'step' -------------------------------------------------------

# (A param given only a count before its first step, saved and loaded, is refused by
# load_state_dict as a stepped param without its states: not supported.)
@pytest.mark.parametrize("when", ["stepped"])
def test_state_dict_holds_a_step_count_set_in_opt_state(when, seed):
    """A count set in opt.state[p]['step'] (docs: 'assigning it sets the count'; the way a
    param joining under a reducing rule is given the others' count) is taken at the next step,
    but state_dict() before that step wrote the old count (or 0) in its place: the checkpoint
    disagreed with opt.state, and (joining) could not step after loading."""
    p = torch.nn.Parameter(torch.randn(4))
    q = torch.nn.Parameter(torch.randn(4))
    opt = ft.Optimizer([p], rule="lamb", lr=1e-2)
    for _ in range(3):
        p.grad = torch.randn(4)
        opt.step()
    if when == "stepped":
        opt.state[p]["step"] = torch.tensor(100.0)
        assert float(opt.state_dict()["state"][0]["step"]) == 100
        return
    opt.add_param_group({"params": [q]})
    opt.state[q]["step"] = 3
    sd = opt.state_dict()
    assert float(sd["state"][1]["step"]) == 3
    again = ft.Optimizer([p], rule="lamb", lr=1e-2)
    again.add_param_group({"params": [q]})
    again.load_state_dict(sd)
    p.grad, q.grad = torch.randn(4), torch.randn(4)
    again.step()  # every param at step 3: one engine
    assert float(again.state[q]["step"]) == float(again.state[p]["step"]) == 4
