"""Mini-batch training: layers on sampled blocks give the full-graph answer when the
sample is the whole neighbourhood (outputs and every gradient, both backends), the
prefetching pipeline changes nothing, batches of different sizes reuse one trace, and
``gnnfuse train --fanout`` runs end to end."""
from __future__ import annotations

import threading

import pytest
import torch

import gnnfuse
from gnnfuse.cli import main
from gnnfuse.frontend import tracer as tracer_module
from gnnfuse.loader import NeighborLoader, batch_maker
from gnnfuse.nn.block_models import build_block_model
from gnnfuse.runtime import compiled as compiled_module

# 7 vertices: a self loop (2->2), a repeated edge (0->1 twice), an isolated vertex (6)
EDGES = torch.tensor([[0, 0, 2, 3, 1, 4, 5, 2, 0, 3], [1, 1, 2, 2, 3, 3, 4, 5, 5, 0]])
NUM_NODES = 7


@pytest.mark.parametrize("model, layers", [("sage", 3), ("gat", 1), ("gat", 2)])
def test_block_model_is_its_paper_s_network_of_pyg_layers(model, layers):
    """`build_block_model`'s network, in eval mode (its dropout 0.5 then off) with PyG's
    layers' weights, on the whole graph and on blocks of whole neighbourhoods: GraphSAGE's
    mean SAGEConvs with ReLU between them, GAT's 8 concatenated heads per hidden layer with
    ELU and one averaged output head; no activation after the last layer."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    ours = build_block_model(model, 3, 2, 4, 0.5, layers).double().eval()
    if model == "sage":
        widths = [3, 4, 4, 2]
        convs = [pyg_nn.SAGEConv(a, b, aggr="mean") for a, b in zip(widths, widths[1:])]
    else:
        convs = [pyg_nn.GATConv(3 if i == 0 else 32, 4, heads=8) for i in range(layers - 1)]
        convs.append(pyg_nn.GATConv(3 if layers == 1 else 32, 2, heads=1, concat=False))
    theirs = torch.nn.ModuleList(convs).double()
    theirs.load_state_dict(ours.convs.state_dict())
    activation = torch.relu if model == "sage" else torch.nn.functional.elu
    x = torch.randn(NUM_NODES, 3, dtype=torch.float64)
    expected = x
    for i, conv in enumerate(theirs):
        expected = conv(expected, EDGES)
        expected = activation(expected) if i < layers - 1 else expected
    graph = gnnfuse.Graph.from_edge_index(EDGES, NUM_NODES)
    torch.testing.assert_close(ours(x, graph), expected, rtol=1e-9, atol=1e-12)
    seeds = torch.tensor([3, 5, 6])
    (batch,) = list(NeighborLoader(graph, [-1] * layers, batch_size=3, input_nodes=seeds, x=x, prefetch=0))
    torch.testing.assert_close(ours(x[batch.n_id], batch.blocks), expected[seeds], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_blocks_with_whole_neighbourhoods_equal_the_full_graph(model, backend, device):
    torch.manual_seed(0)
    graph = gnnfuse.Graph.from_edge_index(EDGES, NUM_NODES).to(device)
    x = torch.randn(NUM_NODES, 3, dtype=torch.float64, device=device)
    net = build_block_model(model, 3, 2, 2, 0.0, 2).double().to(device)
    seeds = torch.tensor([3, 5, 6])
    loader = NeighborLoader(graph, [10, 10], batch_size=3, input_nodes=seeds, x=x, prefetch=0)
    (batch,) = list(loader)
    weights = torch.randn(3, 2, dtype=torch.float64, device=device)

    leaf_full = x.clone().requires_grad_()
    (net(leaf_full, graph)[seeds.to(device)] * weights).sum().backward()
    expected = {name: p.grad.clone() for name, p in net.named_parameters()}
    net.zero_grad()
    leaf_batch = x.clone().requires_grad_()
    out = net(leaf_batch[batch.n_id], batch.blocks)
    (out * weights).sum().backward()

    torch.testing.assert_close(out, net(x, graph)[seeds.to(device)], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(leaf_batch.grad, leaf_full.grad, rtol=1e-9, atol=1e-12)
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_prefetch_yields_the_batches_of_a_plain_run(threads):
    graph = gnnfuse.Graph(torch.randint(0, 40, (160,), generator=torch.Generator().manual_seed(1)),
                          torch.randint(0, 40, (160,), generator=torch.Generator().manual_seed(2)), 40)
    x = torch.randn(40, 4)

    def epoch(prefetch):
        torch.manual_seed(7)
        loader = NeighborLoader(graph, [3, 2], batch_size=6, shuffle=True, x=x, prefetch=prefetch,
                                prefetch_threads=threads)
        return [(b.n_id, b.x, [blk.edge_index for blk in b.blocks]) for b in loader], loader.stage_times

    plain, _ = epoch(0)
    prefetched, times = epoch(3 if threads == 1 else 1)
    assert len(plain) == 7
    for a, b in zip(plain, prefetched, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    totals = times.totals()
    assert times.batches == 7 and totals["sample"] > 0 and totals["reindex"] > 0 and totals["lookup"] > 0


@pytest.mark.parametrize("threads", [1, 2])
def test_prefetch_reraises_a_failure_and_stops_when_abandoned(monkeypatch, threads):
    graph = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    loader = NeighborLoader(graph, [1], batch_size=1, prefetch=2, prefetch_threads=threads)
    epoch = iter(loader)
    assert next(epoch).batch_size == 1
    epoch.close()                                 # abandoned after one batch: the thread is joined
    assert not any(t.name == "gnnfuse-prefetch" for t in threading.enumerate())

    def failing(*args):
        raise RuntimeError("sampling failed")
    monkeypatch.setattr(batch_maker, "sample_slots", failing)
    monkeypatch.setattr(batch_maker, "sample_slots_fused", failing)    # the hop kernels' path (Numba on a CPU)
    with pytest.raises(RuntimeError, match="sampling failed"):
        list(loader)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side stream is a CUDA stream")
def test_every_epoch_prefetches_on_the_loaders_one_side_stream(monkeypatch):
    """torch's allocator keeps freed blocks per stream: a new side stream per epoch left
    each epoch's blocks unusable to the next (0.6 GB more reserved per products-sized epoch)."""
    from gnnfuse.loader import preparation      # where the loaders make their prefetchers
    streams = []

    def recording(*args, **kwargs):
        prefetcher = real(*args, **kwargs)
        streams.append(prefetcher._streams[0])
        return prefetcher
    real = preparation.Prefetcher
    monkeypatch.setattr(preparation, "Prefetcher", recording)
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), 4)
    loader = NeighborLoader(graph, [2], batch_size=2, x=torch.randn(4, 3), device="cuda", prefetch=2)
    for _ in range(3):
        assert len(list(loader)) == 2
    assert len(streams) == 3 and all(s is streams[0] for s in streams)
    assert streams[0] != torch.cuda.current_stream()


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_batches_of_different_sizes_reuse_one_trace_and_program(model, monkeypatch):
    traces = [0]
    init = tracer_module.Tracer.__init__

    def counting(self, *args, **kwargs):
        traces[0] += 1
        init(self, *args, **kwargs)
    monkeypatch.setattr(tracer_module.Tracer, "__init__", counting)
    torch.manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 60, (300,)), torch.randint(0, 60, (300,)), 60)
    net = build_block_model(model, 5, 3, 4, 0.5, 2)
    loader = NeighborLoader(graph, [4, 3], batch_size=13, shuffle=True, x=torch.randn(60, 5), prefetch=0)
    sizes = set()
    for index, batch in enumerate(loader):
        net(batch.x, batch.blocks).sum().backward()
        sizes.add((batch.blocks[0].num_src, batch.blocks[0].graph.num_edges))
        if index == 0:
            after_first, programs = traces[0], len(compiled_module._BY_STRUCTURE)
    assert len(sizes) > 1
    assert traces[0] == after_first, "a batch of another size traced the layer again"
    assert len(compiled_module._BY_STRUCTURE) == programs


@pytest.mark.parametrize("workers", [0, 1])
def test_cli_trains_mini_batches_and_plots_the_stages(workers, tmp_path, capsys):
    path = tmp_path / "curves.png"
    plot = ["--plot", str(path)] if _has_matplotlib() else []
    assert main(["train", "--model", "sage", "--fanout", "5,5", "--batch-size", "64", "--epochs", "2",
                 "--hidden", "8", "--num-workers", str(workers), *plot]) == 0
    out = capsys.readouterr().out
    assert "mini-batch: fanout 5,5" in out and out.count("batches/s") == 2 and "compute" in out
    assert ("1 loader worker process(es)" in out) == (workers == 1)
    assert out.strip().splitlines()[-1].startswith("summary: test acc")
    assert not plot or path.stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["--model", "gcn", "--fanout", "5"], "no mini-batch version"),
    (["--batch-size", "8"], "without a fanout"),
    (["--model", "sage", "--fanout", "5,x"], "comma-separated"),
    (["--model", "sage", "--fanout", "5,0"], "fanout must be"),
    (["--model", "sage", "--num-workers", "1"], "loader workers prepare sampled mini-batches"),
    (["--model", "sage", "--fanout", "5", "--num-workers", "-1"], "loader workers must be >= 0")])
def test_cli_rejects_bad_mini_batch_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_triton_autotuner_keys_on_a_size_class_not_the_batch_count():
    """Every mini-batch has its own edge and segment counts; an autotuner keyed on the
    count itself re-times every configuration of every kernel on every batch. Kernels
    key on ``size_class`` (the count's bit length), so batches within a factor of two
    share one tuned configuration."""
    from gnnfuse.backend.triton.codegen import generate, generate_coo, size_class
    from gnnfuse.frontend import trace_message_passing
    from gnnfuse.passes.fusion import partition
    from gnnfuse.runtime import CompiledProgram
    tracer = trace_message_passing(lambda e: {"m": e.src["h"]}, lambda n: {"out": torch.sum(n.mailbox["m"], dim=1)},
                                   None, ndata={"h": torch.randn(3, 4)}, edata={})
    (unit,) = partition(CompiledProgram(tracer.program).program)
    for make in (generate, generate_coo):
        source, _ = make(unit, "k", "tl.float32", tuned=True)
        assert "key=['size_class']" in source and "size_class, out" in source
    assert size_class(600) == size_class(1000) != size_class(1100)


def test_a_saved_mini_batch_run_loads_back(tmp_path, capsys):
    from gnnfuse.data import load_node_dataset
    from gnnfuse.training import load_checkpoint
    path = tmp_path / "weights.pt"
    assert main(["train", "--model", "sage", "--fanout", "4,4,4", "--epochs", "2", "--hidden", "8",
                 "--save", str(path)]) == 0
    model, checkpoint = load_checkpoint(path)
    assert checkpoint["config"]["fanout"] == (4, 4, 4) and len(model.convs) == 3
    data = load_node_dataset("synthetic")
    assert model(data.x, data.graph).shape == (data.graph.num_nodes, data.num_classes)


def test_cli_dkp_fits_and_reports_the_placement(capsys):
    assert main(["train", "--model", "sage", "--fanout", "4,4", "--batch-size", "128", "--epochs", "1",
                 "--hidden", "8", "--dkp"]) == 0
    out = capsys.readouterr().out
    assert "dynamic kernel placement" in out and "layer " in out and "a*E*W" in out
    with pytest.raises(SystemExit):
        main(["train", "--model", "sage", "--dkp"])
    assert "needs mini-batch training" in capsys.readouterr().err


def test_sage_on_sampled_blocks_equals_pyg_sageconv_on_the_same_edges(backend, device, monkeypatch):
    """Fanouts below the degrees, so the blocks are real samples: the loader's prepared
    layouts (reverse CSR from the sample, the Triton segments, the combine-first rows)
    must give PyG's SAGEConv outputs and every gradient on the same sampled edges. The
    CSR schedule is forced: on graphs this small Triton would pick the edge-parallel one,
    which reads neither CSR."""
    torch_geometric_nn = pytest.importorskip("torch_geometric.nn")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    generator = torch.Generator().manual_seed(5)
    graph = gnnfuse.Graph(torch.randint(0, 40, (320,), generator=generator),
                          torch.randint(0, 40, (320,), generator=generator), 40).to(device)
    x = torch.randn(40, 6, dtype=torch.float64, generator=generator).to(device)
    torch.manual_seed(0)
    ours = build_block_model("sage", 6, 3, 5, 0.0, 2).double().to(device)       # 6->5 aggregates, 5->3 maps first
    theirs = torch.nn.ModuleList(torch_geometric_nn.SAGEConv(a, b, aggr="mean") for a, b in ((6, 5), (5, 3)))
    theirs = theirs.double().to(device)
    theirs.load_state_dict(ours.convs.state_dict())
    loader = NeighborLoader(graph, [3, 2], batch_size=7, input_nodes=torch.arange(0, 40, 3), x=x, prefetch=0)
    batch = next(iter(loader))
    assert any(int(b.graph.in_degrees().max()) < int(graph.in_degrees().max()) for b in batch.blocks)
    weights = torch.randn(batch.batch_size, 3, dtype=torch.float64, device=device)

    def run(layers, step):
        leaf = batch.x.clone().requires_grad_()
        h = leaf
        for i, block in enumerate(batch.blocks):
            h = step(layers[i], h, block)
            h = torch.relu(h) if i < len(batch.blocks) - 1 else h
        (h * weights).sum().backward()
        return h, leaf.grad

    out, grad = run(ours.convs, lambda conv, h, b: conv((h, h[:b.num_dst]), b.graph))
    expected, expected_grad = run(theirs, lambda conv, h, b: conv((h, h[:b.num_dst]), b.edge_index,
                                                                   size=(b.num_src, b.num_dst)))
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-12)
    for (name, p), q in zip(ours.convs.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


class _FakeEvent:
    """A CUDA event on the CPU: done once `done` is set, 5 ms after its start."""
    done = False

    def __init__(self, enable_timing=False):
        self.recorded_on = None

    def record(self, stream=None):
        self.recorded_on = stream

    def query(self):
        return _FakeEvent.done

    def elapsed_time(self, end):
        return 5.0


def test_a_stage_on_a_stream_is_timed_by_events_without_waiting_for_them(monkeypatch):
    """The loader's thread queues a stage's work on its stream and goes on: timing it
    with a synchronize per stage stalled that thread at every stage of every batch."""
    from gnnfuse.loader.stages import StageTimes
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(_FakeEvent, "done", False)
    times, stream = StageTimes(), object()
    with times.timing("sample", stream=stream):
        pass
    assert times.totals()["sample"] == 0.0              # not run on the device yet: not waited for
    _FakeEvent.done = True
    assert times.totals()["sample"] == pytest.approx(0.005) and times.totals()["sample"] == pytest.approx(0.005)


def test_the_loader_times_its_device_stages_by_events_on_its_stream(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(_FakeEvent, "done", True)
    stream = object()                                  # stands for the loader's CUDA stream
    monkeypatch.setattr(batch_maker, "device_stream", lambda device: stream)
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    loader = NeighborLoader(graph, [2, 2], batch_size=2, x=torch.randn(3, 2), prefetch=0)
    next(iter(loader))
    pending = loader.stage_times._pending
    assert {stage for stage, _, _ in pending} == {"sample", "reindex", "lookup", "transfer"}
    assert all(start.recorded_on is stream and end.recorded_on is stream for _, start, end in pending)
    totals = loader.stage_times.totals()
    assert totals["sample"] == pytest.approx(2 * 0.005) and totals["reindex"] == pytest.approx(3 * 0.005)


def test_with_several_threads_a_failing_batch_is_raised_in_its_place(monkeypatch):
    """Batches before the failing one come first, in order; then its error."""
    graph = gnnfuse.Graph(torch.arange(12), (torch.arange(12) + 1) % 12, 12)
    loader = NeighborLoader(graph, [1], batch_size=2, prefetch=1, prefetch_threads=3)
    real = batch_maker.BatchMaker.prepare

    def failing_fifth(self, seeds, *rest):
        if int(seeds[0]) == 8:
            raise RuntimeError("batch 4 failed")
        return real(self, seeds, *rest)
    monkeypatch.setattr(batch_maker.BatchMaker, "prepare", failing_fifth)
    seen = []
    with pytest.raises(RuntimeError, match="batch 4 failed"):
        for batch in loader:
            seen.append(int(batch.input_id[0]))
    assert seen == [0, 2, 4, 6]
    assert not any(t.name == "gnnfuse-prefetch" for t in threading.enumerate())
    with pytest.raises(ValueError, match="prefetch_threads"):
        NeighborLoader(graph, [1], batch_size=2, prefetch_threads=0)


def test_dkp_calibration_draws_nothing_from_the_training_random_state():
    """--dkp fits its placement on an abandoned epoch and on random kernel inputs, which
    drew from torch's generator: the run then trained on other batches than the same
    seed without --dkp (cora, fanout 3,3, epoch 1 loss 1.9623 against 1.9614), where the
    placement may change only the rounding. The calibration leaves the state as it was."""
    from gnnfuse.training.minibatch import _fit_placement
    torch.manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 40, (200,)), torch.randint(0, 40, (200,)), 40)
    model = build_block_model("sage", 12, 3, 6, 0.0, 2)
    loader = NeighborLoader(graph, [4, 3], batch_size=10, x=torch.randn(40, 12), prefetch=0, shuffle=True)
    before = torch.get_rng_state()
    placement = _fit_placement(model, loader)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(conv.placement is placement for conv in model.convs)


def test_a_mini_batch_epochs_losses_are_the_seed_weighted_train_loss_and_the_val_loss():
    """With whole neighbourhoods, no learning rate and no dropout every batch sees the
    full-graph model, so an epoch's reported loss is the cross-entropy over all training
    vertices (batch means weighted by their seeds; an unweighted sum over the seeds
    count had passed) and its validation loss the one over the validation vertices (the
    training ones had passed, and that loss picks the best epoch among ties)."""
    import torch.nn.functional as F
    from gnnfuse.data import load_node_dataset
    from gnnfuse.training import make_config, train_runs
    config = make_config("sage", fanout=(-1, -1), batch_size=30, epochs=1, lr=0.0, dropout=0.0, hidden=8,
                         weight_decay=0.0)
    run = train_runs(config, log_epochs=False).runs[0]
    data = load_node_dataset(config.dataset)
    torch.manual_seed(run.seed)
    model = build_block_model("sage", data.num_features, data.num_classes, 8, 0.0, 2).eval()
    with torch.no_grad():
        logits = model(data.x, data.graph)
    assert int(data.train_mask.sum()) % 30, "the last batch should be shorter"
    for key, mask in (("loss", data.train_mask), ("val_loss", data.val_mask)):
        expected = F.cross_entropy(logits[mask], data.y[mask]).item()
        assert run.history[key] == pytest.approx([expected], rel=1e-5), key
