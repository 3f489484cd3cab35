"""Dynamic kernel placement (GraphTensor Table I): the least-squares fit recovers the
coefficients that generated kernel times, decisions follow Table I's benefit
comparison, either order computes the same layer (outputs and gradients, both
backends), and calibration on real blocks installs a model that the layers use."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.loader import NeighborLoader
from gnnfuse.nn import SAGEConv
from gnnfuse.nn import conv as conv_module
from gnnfuse.nn.block_models import build_block_model
from gnnfuse.nn.conv import combine_first_moves_less, maps_first
from gnnfuse.nn.placement import KINDS, FixedPlacement, KernelTime, PlacementModel, calibrate, install

TRUE = {"matmul": (2e-9, 3e-7, 1e-5), "matmul-weight-only": (1e-9, 1e-7, 0.0), "aggregate": (4e-8, 5e-7, 2e-5),
        "aggregate-forward-only": (2e-8, 0.0, 1e-5)}


def synthetic_samples():
    gen = torch.Generator().manual_seed(0)
    samples = []
    for kind, (a, b, c) in TRUE.items():
        for _ in range(6):
            rows, edges = int(torch.randint(10, 5000, (1,), generator=gen)), int(torch.randint(10, 50000, (1,),
                                                                                              generator=gen))
            f, h = int(torch.randint(4, 300, (1,), generator=gen)), int(torch.randint(4, 300, (1,), generator=gen))
            if kind.startswith("matmul"):
                seconds = a * rows * f * h + b * rows * h + c
                samples.append(KernelTime(kind, rows, 0, f, h, seconds))
            else:
                samples.append(KernelTime(kind, rows, edges, f, f, a * edges * f + b * rows * f + c))
    return samples


def test_fit_recovers_the_generating_coefficients():
    model = PlacementModel.fit(synthetic_samples())
    for kind in KINDS:
        torch.testing.assert_close(torch.tensor(model.coefficients[kind]), torch.tensor(TRUE[kind]), rtol=1e-6,
                                   atol=1e-12)


def test_a_fit_of_collinear_terms_is_not_decided_by_rounding():
    """One width in every matmul sample makes rows*F*H and rows*H collinear, so several
    column subsets fit exactly; which was kept followed the last bits of the residuals,
    which vary from call to call, so a --dkp run and its resumed copy fitted different
    models (tests/test_train_resume.py failed one time in two). Times perturbed at the
    rounding level must give the same subset."""
    sizes = [(100, 64, 64), (400, 64, 64), (900, 64, 64), (2500, 64, 64)]
    patterns = set()
    for ulp in range(-3, 4):
        samples = [KernelTime("matmul", rows, 0, f, h, (1e-9 * rows * f * h + 2e-8 * rows * h + 1e-5)
                              * (1 + ulp * 2.0 ** -52)) for rows, f, h in sizes]
        patterns.add(tuple(c == 0.0 for c in PlacementModel.fit(samples).coefficients["matmul"]))
    assert len(patterns) == 1, patterns


def test_decision_is_table_one_benefit_comparison():
    model = PlacementModel.fit(synthetic_samples())
    (alpha, beta, _), (gamma, delta, _) = TRUE["matmul"], TRUE["aggregate"]   # constants cancel
    for n_src, n_dst, edges, f, h in [(5000, 500, 20000, 100, 256), (5000, 500, 20000, 256, 16),
                                      (800, 790, 900, 64, 60), (3000, 100, 90000, 50, 40)]:
        aggregate_first_benefit = (n_src - n_dst) * (alpha * f * h + beta * h)
        combine_first_benefit = (f - h) * (gamma * edges + delta * n_dst)
        expected = "combine-first" if combine_first_benefit > aggregate_first_benefit else "aggregate-first"
        assert model.choose(n_src, n_dst, edges, f, h, input_grad=True) == expected
    assert "layer 100->256" in model.describe()


def test_fit_refuses_no_samples_and_a_one_layer_model_calibrates():
    with pytest.raises(ValueError, match="no kernel times"):
        PlacementModel.fit([])
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), 4)
    model = build_block_model("sage", 5, 2, 4, 0.0, 1)
    batches = list(NeighborLoader(graph, [2], batch_size=2, x=torch.randn(4, 5), prefetch=0))
    placement = calibrate(model, batches, repeats=1)
    model(batches[0].x, batches[0].blocks)
    assert "matmul-weight-only" in placement.describe() and "layer 5->2" in placement.describe()


@pytest.mark.parametrize("aggr", ["mean", "sum"])
def test_both_orders_compute_the_same_layer(aggr, backend, device):
    torch.manual_seed(0)
    graph = gnnfuse.Graph(torch.tensor([0, 3, 4, 4, 1, 2]), torch.tensor([0, 1, 1, 2, 2, 2]), 3, num_src_nodes=5)
    graph = graph.to(device)
    conv = SAGEConv(4, 3, aggr=aggr).double().to(device)
    x = torch.randn(5, 4, dtype=torch.float64, device=device)
    results = []
    for order in ("aggregate-first", "combine-first"):
        conv.placement = FixedPlacement(order)
        leaf = x.clone().requires_grad_()
        out = conv((leaf, leaf[:3]), graph)
        out.pow(2).sum().backward()
        results.append((out.detach(), leaf.grad, [p.grad.clone() for p in conv.parameters()]))
        conv.zero_grad()
        assert conv.placement.decisions[4, 3, order] == 1
    (out_a, gx_a, gp_a), (out_c, gx_c, gp_c) = results
    torch.testing.assert_close(out_a, out_c, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gx_a, gx_c, rtol=1e-9, atol=1e-12)
    for a, c in zip(gp_a, gp_c):
        torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("width_in, width_out, input_grad, weight_grad, first", [
    (100, 64, False, True, False),     # products-sized SAGE's first layer: 100 lanes once < 64 twice
    (100, 64, True, True, True),       # its input needs a gradient too: 64 twice < 100 twice
    (100, 64, False, False, True),     # inference: 64 < 100
    (128, 64, False, True, False),     # a tie (128 lanes either way) aggregates first: one pass fewer
    (128, 63, False, True, True),
    (64, 100, True, True, False),      # widening never maps first
    (64, 100, False, False, False),
])
def test_static_rule_counts_lanes_moved_over_the_step(width_in, width_out, input_grad, weight_grad, first):
    assert combine_first_moves_less(width_in, width_out, input_grad, weight_grad) is first


def test_the_numba_backend_maps_first_whenever_the_map_narrows(monkeypatch):
    """Its kernels keep rows of up to 64 lanes in registers, so lanes moved do not rank
    the orders there; the other backends count lanes."""
    x, weight = torch.randn(3, 100), torch.randn(64, 100, requires_grad=True)
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    assert maps_first(100, 64, x, weight) and not maps_first(64, 100, x, weight[:, :64])
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    assert not maps_first(100, 64, x, weight)


@pytest.mark.parametrize("input_grad", [False, True])
def test_sage_without_placement_takes_the_static_order(input_grad, monkeypatch):
    """No placement installed: a first layer (input without gradient) narrowing 10 -> 6
    aggregates first, the same layer with an input gradient maps first; both give eager
    PyG-style values and weight gradients."""
    calls = []
    real = conv_module.transform_first_rows      # what mapping first reads, alone or paired with the root
    monkeypatch.setattr(conv_module, "transform_first_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    graph = gnnfuse.Graph(torch.tensor([0, 3, 4, 4, 1, 2, 2]), torch.tensor([0, 1, 1, 2, 2, 2, 4]), 5)
    conv = SAGEConv(10, 6).double()
    x = torch.randn(5, 10, dtype=torch.float64, requires_grad=input_grad)
    out = conv(x, graph)
    out.pow(2).sum().backward()
    assert bool(calls) is input_grad
    weights = [p.detach().clone().requires_grad_() for p in (conv.lin_l.weight, conv.lin_l.bias, conv.lin_r.weight)]
    counts = torch.zeros(5, dtype=torch.float64).index_add_(0, graph.dst, torch.ones(7, dtype=torch.float64))
    mean = torch.zeros(5, 10, dtype=torch.float64).index_add_(0, graph.dst, x.detach()[graph.src])
    mean = mean / counts.clamp(min=1).unsqueeze(1)
    expected = mean @ weights[0].t() + weights[1] + x.detach() @ weights[2].t()
    expected.pow(2).sum().backward()
    torch.testing.assert_close(out.detach(), expected.detach(), rtol=1e-12, atol=1e-12)
    for param, ref in zip((conv.lin_l.weight, conv.lin_l.bias, conv.lin_r.weight), weights):
        torch.testing.assert_close(param.grad, ref.grad, rtol=1e-12, atol=1e-12)


def test_calibration_fits_on_blocks_and_installs():
    torch.manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 80, (500,)), torch.randint(0, 80, (500,)), 80)
    model = build_block_model("sage", 12, 3, 6, 0.0, 3)
    loader = NeighborLoader(graph, [5, 4, 3], batch_size=20, x=torch.randn(80, 12), prefetch=0)
    batches = list(loader)
    placement = calibrate(model, batches[:2], repeats=1)
    assert set(placement.coefficients) == set(KINDS)
    assert all(conv.placement is placement for conv in model.convs)
    model(batches[2].x, batches[2].blocks).sum().backward()
    assert sum(placement.decisions.values()) == 3
    install(model, None)
    assert all(conv.placement is None for conv in model.convs)


def test_explain_shows_the_fitted_model_and_this_calls_decisions():
    torch.manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 40, (200,)), torch.randint(0, 40, (200,)), 40)
    model = build_block_model("sage", 12, 3, 6, 0.0, 2)
    batches = list(NeighborLoader(graph, [4, 3], batch_size=10, x=torch.randn(40, 12), prefetch=0))
    placement = calibrate(model, batches[:2], repeats=1)
    model(batches[0].x, batches[0].blocks)                 # decisions before the explained call
    text = str(gnnfuse.explain(model, batches[1].x, batches[1].blocks))
    assert "dynamic kernel placement" in text and "a*E*W" in text
    decided = text.split("decisions in this call:")[1]
    assert decided.count(" x1") == 2 and "layer 12->6" in decided and "layer 6->3" in decided
    assert sum(placement.decisions.values()) == 4


def test_a_layer_is_placed_by_the_aggregation_it_runs_not_by_a_name_set_later():
    """A max layer whose ``aggr`` a user set to 'mean' afterwards still runs max (as in
    PyG); a placement model must not move its map across the max."""
    from gnnfuse.nn.placement import placeable
    conv = SAGEConv(4, 3, aggr="max")
    conv.aggr = "mean"
    assert not placeable(conv)
    conv = SAGEConv(4, 3, aggr="mean")
    conv.aggr = "max"
    assert placeable(conv)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1e-3])
def test_fit_refuses_a_kernel_time_that_is_not_a_finite_non_negative_number(seconds):
    """A NaN time crashed inside LAPACK ('INTERNAL ASSERT FAILED ... Argument 6 has
    illegal value'); an infinite or negative one fitted all-zero coefficients, a model
    that silently always aggregates first."""
    samples = [KernelTime("matmul", 10, 0, 4, 4, seconds), KernelTime("matmul", 100, 0, 4, 4, 1e-3)]
    with pytest.raises(ValueError, match="matmul kernel .* must be finite numbers of seconds >= 0"):
        PlacementModel.fit(samples)


def test_calibration_refuses_zero_repeats():
    """No timed run left every time infinite and the fit all zeros, without a word."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), 4)
    model = build_block_model("sage", 5, 2, 4, 0.0, 2)
    batches = list(NeighborLoader(graph, [2, 2], batch_size=2, x=torch.randn(4, 5), prefetch=0))
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        calibrate(model, batches, repeats=0)


def test_a_one_layer_calibration_places_a_call_whose_input_needs_a_gradient():
    """Calibrating a one-layer model times only kernels without an input gradient; a
    call on features that need one then failed with KeyError: 'matmul'. It takes the
    kernels' other-gradient fits, and both orders still give one answer; a model with
    no matmul fit at all is refused by name."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), 4)
    model = build_block_model("sage", 5, 2, 4, 0.0, 1)
    batches = list(NeighborLoader(graph, [2], batch_size=2, x=torch.randn(4, 5), prefetch=0))
    placement = calibrate(model, batches, repeats=1)
    assert "matmul" not in placement.coefficients
    x = batches[0].x.clone().requires_grad_()
    model(x, batches[0].blocks).sum().backward()
    assert x.grad is not None and sum(placement.decisions.values()) == 1
    aggregate_only = PlacementModel.fit([KernelTime("aggregate", 10, 20, 4, 4, 1e-3)])
    with pytest.raises(ValueError, match="no fitted times of a matmul kernel"):
        aggregate_only.choose(10, 5, 20, 4, 3, input_grad=True)


def test_calibrate_draws_nothing_from_the_callers_random_state():
    """`calibrate` times kernels on random inputs drawn from torch's generator, so a
    user's seeded run that calibrated before training trained on other dropout masks
    and initialisations than the same seed without it, where the placement may change
    only the rounding. The CLI's --dkp path forks the state around it; a direct call
    must leave the caller's state as it was too."""
    torch.manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 40, (200,)), torch.randint(0, 40, (200,)), 40)
    model = build_block_model("sage", 12, 3, 6, 0.0, 2)
    batches = list(NeighborLoader(graph, [4, 3], batch_size=10, x=torch.randn(40, 12), prefetch=0))
    before = torch.get_rng_state()
    calibrate(model, batches[:2], repeats=1)
    assert torch.equal(torch.get_rng_state(), before)
