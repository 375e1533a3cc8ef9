"""fusedopt.torch.Optimizer.load_state_dict is all or nothing: a bad state dict raises a
ValueError naming what is wrong and leaves the optimizer bit for bit as it was; torch's
spellings of steps and states load and step on the same.
"""
import math

import pytest
import torch

import fusedopt.torch as ft
from test_torch_optimizer import feed, make_params, twin


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
