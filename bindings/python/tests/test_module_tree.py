"""nn.Module's tree API from Python, as PyTorch has it: named_modules() starting with the module
itself, children() and modules() as the modules' most derived classes, apply(), to() with keywords,
weight and bias as attributes, and the assignment rules for buffers of a module written in Python."""

import numpy as np
import pytest

import braid
from braid import nn


def npy(t):
    return t.detach().numpy()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 5)
        self.fc2 = nn.Linear(5, 2)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def test_buffers_of_python_modules_follow_pytorchs_assignment_rules():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", braid.zeros(2))

        def forward(self, x):
            return x + self.count

    m = Counter()
    assert [n for n, _ in m.named_buffers()] == ["count"] and m.parameters() == []
    m.count = braid.full((2,), 3.0)  # a tensor assigned to a buffer's name replaces the buffer
    np.testing.assert_array_equal(npy(m.state_dict()["count"]), [3.0, 3.0])
    np.testing.assert_array_equal(npy(nn.Sequential(m)(braid.ones(2))), [4.0, 4.0])  # what C++ reads
    with pytest.raises(TypeError, match="'count', a registered buffer"):
        m.count = 5
    np.testing.assert_array_equal(npy(m.count), [3.0, 3.0])


def test_module_tree_lists_are_the_modules_themselves():
    net = Net()
    (root_name, root), *rest = net.named_modules()
    assert root_name == "" and root is net  # a Python module is its own Python object
    assert [(n, type(m)) for n, m in rest] == [("fc1", nn.Linear), ("fc2", nn.Linear)]
    assert [type(m) for m in net.children()] == [nn.Linear, nn.Linear]
    assert net.modules()[0] is net and len({net, net, Net()}) == 2  # modules hash by identity
    seq = nn.Sequential(net, nn.ReLU())
    assert [type(m).__name__ for m in seq.modules()] == ["Sequential", "Net", "Linear", "Linear", "ReLU"]
    assert seq.apply(lambda m: m.eval()) is seq and not any(m.training for m in seq.modules())
    assert net.to(device="cpu", dtype=braid.float64) is net and net.fc1.weight.dtype == braid.float64
    assert isinstance(net.fc1.bias, braid.Tensor) and nn.Embedding(3, 2).weight.shape == (3, 2)
