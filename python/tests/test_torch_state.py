"""fusedopt.torch.Optimizer's states and params as live tensors: state views alias the kernels'
memory, a deep copy steps on its own, factored and scalar states in torch's shapes, steady
steps that follow a moved param or a replaced gradient, and zero_grad freeing gradients.
"""
import torch

import fusedopt.torch as ft
from test_torch_optimizer import close, compare_states, feed, make_params, twin


def test_state_views_alias_the_kernels_memory(seed):
    p = torch.randn(10, requires_grad=True)
    opt = ft.Optimizer([p], rule="sgd", lr=0.1, momentum=0.9)
    p.grad = torch.ones(10)
    opt.step()
    buf = opt.state[p]["momentum_buffer"]
    assert torch.equal(buf, torch.ones(10))
    opt.step()
    assert torch.allclose(buf, torch.full((10,), 1.9))  # the same memory, updated in place


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
