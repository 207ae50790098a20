"""An optimizer's state_dict from Python: a run resumed from it (into a new model and optimizer)
takes exactly the steps of the run that never stopped, for Adam's moments and SGD's momentum."""

import pytest

import braid
from braid import nn, optim


def steps(model, opt, x, n):
    for _ in range(n):
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        opt.step()


@pytest.mark.parametrize("make", [lambda p: optim.Adam(p, lr=0.1, betas=(0.8, 0.9)),
                                  lambda p: optim.SGD(p, lr=0.05, momentum=0.9)])
def test_resuming_from_state_dict_continues_the_same_run(make):
    braid.manual_seed(0)
    x = braid.randn(4, 3, dtype=braid.float64)
    model = nn.Linear(3, 2).double()
    opt = make(model.parameters())
    steps(model, opt, x, 3)
    saved_model, saved_opt = model.state_dict(), opt.state_dict()
    saved_model = {k: v.clone() for k, v in saved_model.items()}  # the tensors share the model's memory
    resumed = nn.Linear(3, 2).double()
    resumed.load_state_dict(saved_model)
    resumed_opt = make(resumed.parameters())
    resumed_opt.load_state_dict(saved_opt)
    fresh = nn.Linear(3, 2).double()  # the same weights without the optimizer's state
    fresh.load_state_dict(saved_model)
    steps(model, opt, x, 2)
    steps(resumed, resumed_opt, x, 2)
    steps(fresh, make(fresh.parameters()), x, 2)
    for name, p in model.named_parameters():
        q = dict(resumed.named_parameters())[name]
        assert (p - q).abs().max().item() == 0, name
    # The state mattered: without it the same two steps end elsewhere.
    assert max((p - dict(fresh.named_parameters())[n]).abs().max().item() for n, p in model.named_parameters()) > 1e-3
