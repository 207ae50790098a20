"""Distributed training from Python, run by `meson test` under `mpiexec -n 2` and `-n 4` (and
plainly as a world of one): N ranks must equal one process on the same data."""

import numpy as np
import pytest

import braid
from braid import nn, optim

info = braid.distributed.init()
RANK, SIZE = info.rank, info.size


class MLP(nn.Module):
    """A model written in Python: its forward is what DDP's and the pipeline's C++ code calls."""

    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])])
        self.scale = nn.Parameter(braid.ones(sizes[-1]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = braid.tanh(x)
        return x * self.scale


def batches(steps, n, d, classes, seed=7):
    rng = np.random.RandomState(seed)
    return [(rng.randn(n, d).astype(np.float32), rng.randint(0, classes, n).astype(np.int64)) for _ in range(steps)]


def test_world_matches_launcher():
    import os

    expected = int(os.environ.get("PMI_SIZE", "1"))
    assert SIZE == expected
    assert 0 <= RANK < SIZE


def test_all_reduce_sum_and_broadcast_closed_form():
    t = braid.full((3,), float(RANK + 1))
    braid.distributed.all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), np.full(3, SIZE * (SIZE + 1) / 2, np.float32))
    b = braid.full((2,), float(RANK * 10))
    braid.distributed.broadcast(b, src=SIZE - 1)
    np.testing.assert_array_equal(b.numpy(), np.full(2, (SIZE - 1) * 10, np.float32))


def test_ddp_of_a_python_module_equals_one_process():
    per_rank, steps = 4, 4
    data = batches(steps, per_rank * SIZE, 6, 3)

    braid.manual_seed(11)
    ref = MLP([6, 10, 3])
    ref_opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in data:
        ref_opt.zero_grad()
        nn.functional.cross_entropy(ref(braid.from_numpy(x)), braid.from_numpy(y)).backward()
        ref_opt.step()

    braid.manual_seed(100 + RANK)  # different starting weights per rank: DDP broadcasts rank 0's
    model = MLP([6, 10, 3])
    braid.manual_seed(11)
    start = MLP([6, 10, 3])
    if RANK == 0:
        model.load_state_dict(start.state_dict())
    ddp = braid.distributed.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in data:
        shard = slice(RANK * per_rank, (RANK + 1) * per_rank)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(braid.from_numpy(x[shard])), braid.from_numpy(y[shard])).backward()
        opt.step()
    got, want = model.state_dict(), ref.state_dict()
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.skipif(SIZE < 2, reason="a pipeline needs at least 2 ranks (one stage each)")
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1"])
def test_pipeline_of_python_stages_equals_one_process(schedule):
    sizes = [5] + [7] * (SIZE - 1) + [3]  # one Linear per stage
    data = batches(3, 8, 5, 3, seed=3)

    def loss_fn(out, target):
        return nn.functional.cross_entropy(out, target)

    braid.manual_seed(5)
    ref = MLP(sizes)
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    ref_losses = []
    for x, y in data:
        ref_opt.zero_grad()
        loss = loss_fn(ref(braid.from_numpy(x)), braid.from_numpy(y))
        ref_losses.append(loss.item())
        loss.backward()
        ref_opt.step()

    class Stage(nn.Module):
        def __init__(self, layer, scale=None):
            super().__init__()
            self.layer = layer
            self.last = scale is not None
            if self.last:
                self.scale = nn.Parameter(scale)

        def forward(self, x):
            x = self.layer(x)
            return x * self.scale if self.last else braid.tanh(x)

    braid.manual_seed(5)
    full = MLP(sizes)
    stage = Stage(full.layers[RANK], full.scale.detach() if RANK == SIZE - 1 else None)
    pipe = braid.distributed.PipelineStage(stage, braid.distributed.world())
    opt = optim.SGD(stage.parameters(), lr=0.1)
    sched = braid.distributed.make_schedule(schedule, SIZE, 4)
    for (x, y), want in zip(data, ref_losses):
        opt.zero_grad()
        loss = pipe.train_step(sched, braid.from_numpy(x), braid.from_numpy(y), loss_fn)
        assert loss == pytest.approx(want, abs=1e-5)
        opt.step()
    ref_layer = ref.layers[RANK]
    np.testing.assert_allclose(stage.layer.weight.detach().numpy(), ref_layer.weight.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(stage.layer.bias.detach().numpy(), ref_layer.bias.detach().numpy(), atol=1e-5)


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x):
        return self.fc(braid.relu(self.bn(self.conv(x))).flatten(1))


def test_sync_batchnorm_under_ddp_equals_one_process():
    """convert_sync_batchnorm: batch statistics over the global batch, so N ranks on shards equal one
    process with BatchNorm on the whole batch (weights and running statistics)."""
    per_rank = 3
    rng = np.random.RandomState(5)
    data = [(rng.randn(per_rank * SIZE, 2, 4, 4).astype(np.float32), rng.randint(0, 2, per_rank * SIZE).astype(np.int64))
            for _ in range(3)]
    braid.manual_seed(4)
    ref = BNNet()
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    for x, y in data:
        ref_opt.zero_grad()
        nn.functional.cross_entropy(ref(braid.from_numpy(x)), braid.from_numpy(y)).backward()
        ref_opt.step()

    braid.manual_seed(4)
    model = BNNet()
    assert braid.distributed.convert_sync_batchnorm(model) == 1
    ddp = braid.distributed.DistributedDataParallel(model)
    opt = optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        shard = slice(RANK * per_rank, (RANK + 1) * per_rank)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(braid.from_numpy(x[shard])), braid.from_numpy(y[shard])).backward()
        opt.step()
    got, want = model.state_dict(), ref.state_dict()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_no_sync_accumulates_then_averages():
    """Two micro-batches per step, the first under no_sync: the same weights as one process on the
    whole batch (gradients of the two halves summed, averaged over ranks)."""
    per_rank = 2
    data = batches(2, 2 * per_rank * SIZE, 6, 3, seed=9)
    braid.manual_seed(12)
    ref = MLP([6, 5, 3])
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    for x, y in data:
        ref_opt.zero_grad()
        for half in (slice(0, per_rank * SIZE), slice(per_rank * SIZE, 2 * per_rank * SIZE)):
            # mean over each half, so the two halves' sum is what the accumulating ranks compute
            nn.functional.cross_entropy(ref(braid.from_numpy(x[half])), braid.from_numpy(y[half])).backward()
        ref_opt.step()

    braid.manual_seed(12)
    model = MLP([6, 5, 3])
    ddp = braid.distributed.DistributedDataParallel(model)
    opt = optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        opt.zero_grad()
        for k, half in enumerate((slice(0, per_rank * SIZE), slice(per_rank * SIZE, 2 * per_rank * SIZE))):
            xs, ys = x[half][RANK * per_rank:(RANK + 1) * per_rank], y[half][RANK * per_rank:(RANK + 1) * per_rank]
            if k == 0:
                with ddp.no_sync():
                    nn.functional.cross_entropy(ddp(braid.from_numpy(xs)), braid.from_numpy(ys)).backward()
            else:
                nn.functional.cross_entropy(ddp(braid.from_numpy(xs)), braid.from_numpy(ys)).backward()
        opt.step()
    for name, v in ref.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], v, rtol=0, atol=1e-6, err_msg=name)


def test_cpp_holders_keep_a_python_module_alive_and_take_options_as_keywords():
    """A PipelineStage and a DistributedDataParallel keep the Python module they call alive
    (Note [Python objects that C++ holds]), and take their options structs' fields as keywords."""
    import gc

    braid.manual_seed(3)
    ref = MLP([3, 2])
    solo = braid.distributed.world().split(RANK, 0)  # a pipeline of one stage per rank
    braid.manual_seed(3)
    stage = braid.distributed.PipelineStage(MLP([3, 2]), solo, recompute=True)  # no other reference
    gc.collect()
    x = braid.ones(1, 3)
    np.testing.assert_allclose(stage.forward(x).numpy(), ref(x).detach().numpy(), atol=1e-6)
    ddp = braid.distributed.DistributedDataParallel(MLP([3, 2]), bucket_cap_mb=0)
    assert len(ddp.bucket_names()) == 3  # bucket_cap_mb=0: a bucket per parameter
    with pytest.raises(TypeError, match="unknown option 'bucket_cap'; known: autotune, autotune_caps_mb, .*, bucket_cap_mb"):
        braid.distributed.DistributedDataParallel(MLP([3, 2]), bucket_cap=1)


def test_make_grid_places_ranks_by_the_closed_form():
    """Note [Grid placement]: rank r = (replica P + stage) T + tensor_rank; each group's members sum."""
    dist = braid.distributed
    for pipeline, tensor in ((1, 1), (1, SIZE), (SIZE, 1)):
        shape = dist.GridShape()
        shape.pipeline, shape.tensor = pipeline, tensor
        g = dist.make_grid(shape)
        assert (g.tensor_rank, g.stage, g.replica) == (RANK % tensor, (RANK // tensor) % pipeline,
                                                       RANK // (pipeline * tensor))
        assert g.shape.data == SIZE // (pipeline * tensor)
        t = braid.full((1,), float(RANK))
        dist.all_reduce(t, group=g.tensor)
        first = RANK - g.tensor_rank
        assert t.numpy()[0] == sum(range(first, first + tensor))
    shape = dist.GridShape()
    shape.data = SIZE + 1
    with pytest.raises(ValueError, match=f"{SIZE} ranks do not form a grid of {SIZE + 1} replicas"):
        dist.make_grid(shape)


def test_comm_hooks_from_python():
    """A top-K hook of every entry is DDP's all-reduce bit for bit; a sparse one leaves every rank the same weights."""
    dist = braid.distributed
    data = batches(3, 4 * SIZE, 6, 3)

    def run(hook):
        braid.manual_seed(5)
        model = MLP([6, 10, 3])
        ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.0)
        if hook is not None:
            ddp.register_comm_hook(hook)
        opt = optim.SGD(model.parameters(), lr=0.1)
        for x, y in data:
            shard = slice(RANK * 4, (RANK + 1) * 4)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(braid.from_numpy(x[shard])), braid.from_numpy(y[shard])).backward()
            opt.step()
        assert ddp.comm_hook().name().startswith("allreduce" if hook is None else hook.name()[:5])
        return {k: v.numpy().copy() for k, v in model.state_dict().items()}

    plain, dense = run(None), run(dist.TopKHook(ratio=1.0))
    for k in plain:
        np.testing.assert_array_equal(dense[k], plain[k], err_msg=k)
    sparse = run(dist.TopKHook(ratio=0.1, momentum=0.9))
    for k, v in sparse.items():
        everyone = dist.all_gather(braid.from_numpy(v)).numpy()
        assert (everyone == everyone[0]).all(), k
    assert dist.PowerSGDHook(rank=2).name() == "PowerSGD (rank 2, error feedback)"


def test_join_and_local_sgd_from_python():
    """Uneven shards under Join end with every rank alike; so do LocalSGD every 2 steps and sync_now()."""
    dist = braid.distributed
    braid.manual_seed(8)
    model = MLP([6, 10, 3])
    ddp = dist.DistributedDataParallel(model)
    opt = optim.SGD(model.parameters(), lr=0.1)
    join = dist.Join(ddp)
    mine = batches(RANK + 1, 4, 6, 3, seed=30 + RANK)  # rank r has r + 1 batches
    for x, y in mine:
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(braid.from_numpy(x)), braid.from_numpy(y)).backward()
        opt.step()
    join.finish()
    assert join.shadowed_steps() == SIZE - 1 - RANK
    braid.manual_seed(9)
    local = MLP([6, 10, 3])
    ls = dist.LocalSGD(local, None, period=2, outer="nesterov", outer_lr=0.7)
    opt = optim.SGD(local.parameters(), lr=0.1)
    for x, y in batches(5, 4, 6, 3, seed=50 + RANK):
        opt.zero_grad()
        nn.functional.cross_entropy(local(braid.from_numpy(x)), braid.from_numpy(y)).backward()
        opt.step()
        ls.step()
    assert (ls.syncs(), ls.local_steps()) == (2, 1)
    assert ls.sync_now() and not ls.sync_now()  # the fifth step averaged now, then nothing to average
    assert ls.syncs() == 3
    for m in (model, local):
        for k, v in m.state_dict().items():
            everyone = dist.all_gather(v).numpy()
            assert (everyone == everyone[0]).all(), k


def test_parameter_server_with_dynamic_batches_from_python():
    """One server, the other ranks claim batches (ps.next_batch()); at staleness 0 each round of W
    batches is one SGD step on their average, as written out here, and every rank ends alike."""
    if SIZE < 2:
        pytest.skip("needs a server and a worker")
    dist = braid.distributed
    W, T = SIZE - 1, 2 * (SIZE - 1) + 1  # the last round has one batch
    data = batches(T, 4, 6, 3, seed=70)
    braid.manual_seed(10)
    model = MLP([6, 10, 3])
    ps = dist.ParameterServer(model, optim.SGD(model.parameters(), lr=0.1), None, servers=1, dynamic_batches=T)
    assert ps.is_server() == (RANK == 0) and ps.workers() == W
    if ps.is_server():
        ps.serve()
    else:
        while (b := ps.next_batch()) >= 0:
            x, y = data[b]
            model.zero_grad()
            nn.functional.cross_entropy(model(braid.from_numpy(x)), braid.from_numpy(y)).backward()
        ps.finish()
        assert all(p.version == p.batch // W for p in ps.pulls())
    braid.manual_seed(10)
    ref = MLP([6, 10, 3])
    opt = optim.SGD(ref.parameters(), lr=0.1)
    for r in range(0, T, W):
        opt.zero_grad()
        for x, y in data[r:r + W]:
            n = min(W, T - r)
            (nn.functional.cross_entropy(ref(braid.from_numpy(x)), braid.from_numpy(y)) * (1.0 / n)).backward()
        opt.step()
    want = {k: v.numpy().copy() for k, v in ref.state_dict().items()}
    for k, v in model.state_dict().items():
        everyone = dist.all_gather(v).numpy()
        assert (everyone == everyone[0]).all(), k
        np.testing.assert_allclose(v.numpy(), want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_hierarchical_all_reduce_from_python():
    """Two nodes of two ranks (ranks_per_node overrides the hosts): integer data sums to the flat
    all-reduce's values, and each rank sends half the elements across nodes (the inter group's counter)."""
    dist = braid.distributed
    opts = dict(ranks_per_node=2, min_bytes=0)
    layout = dist.node_layout(dist.world(), **opts)
    if SIZE != 4:
        assert not layout.hierarchical() and dist.make_hierarchical_group(dist.world(), **opts) is None
        return
    assert (layout.nodes, layout.ranks_per_node, layout.node, layout.local_rank) == (2, 2, RANK // 2, RANK % 2)
    group = dist.make_hierarchical_group(dist.world(), **opts)
    group.inter().reset_traffic()
    x = braid.from_numpy(np.arange(1000, dtype=np.float32) * (RANK + 1))
    group.all_reduce(x)
    np.testing.assert_array_equal(x.numpy(), np.arange(1000, dtype=np.float32) * 10)
    assert group.inter().traffic().all_reduce.elements == 500
