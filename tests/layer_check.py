"""The comparison every layer test makes against its oracle (a PyG layer or a plain
PyTorch one): outputs, the input gradient and every parameter gradient in float64."""
from __future__ import annotations

from typing import Callable

import torch

from gnnfuse.runtime import record_calls


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b|, on ``b``'s device: a layer run on a GPU has its parameter gradients
    there while the oracle's stay on the CPU."""
    return ((a.to(b.device) - b).norm() / b.norm()).item()


def assert_same_outputs_and_grads(ours: torch.nn.Module, ref: torch.nn.Module,
                                  run_ours: Callable[[torch.Tensor], torch.Tensor],
                                  run_ref: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                                  ref_prefix: str = "") -> None:
    """Outputs, input gradient and every parameter gradient agree to 1e-9 relative.
    ``ref``'s parameters carry ``ref_prefix`` before ours' names (an oracle holding the
    layer as ``layer`` has ``layer.``); both must have the same parameters."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = run_ours(xa), run_ref(xb)
    assert out.shape == expected.shape
    seed = torch.randn_like(expected)
    (out * seed).sum().backward()
    (expected * seed).sum().backward()
    assert rel_err(out, expected) < 1e-9
    assert rel_err(xa.grad, xb.grad) < 1e-9
    ours_params, ref_params = dict(ours.named_parameters()), dict(ref.named_parameters())
    assert {ref_prefix + key for key in ours_params} == ref_params.keys()
    for key, p in ours_params.items():
        q = ref_params[ref_prefix + key]
        assert p.grad is not None and q.grad is not None, key
        assert rel_err(p.grad, q.grad) < 1e-9, key


def outputs_and_grads(layer: torch.nn.Module, run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                      cotangent_seed: int = 0) -> dict[str, torch.Tensor]:
    """``run(x)``'s output, and the gradients of ``<output, c>`` (``c`` a fixed random
    cotangent) for ``x`` and every parameter of ``layer`` -- zeros where none reached it."""
    layer.zero_grad(set_to_none=True)
    xs = x.clone().requires_grad_()
    out = run(xs)
    generator = torch.Generator().manual_seed(cotangent_seed)
    cotangent = torch.randn(out.shape, dtype=out.dtype, generator=generator).to(out.device)
    (out * cotangent).sum().backward()
    leaves = {"x": xs, **dict(layer.named_parameters())}
    return {"out": out.detach(), **{name: torch.zeros_like(leaf) if leaf.grad is None else leaf.grad
                                    for name, leaf in leaves.items()}}


def assert_same_values(actual: torch.Tensor, expected: torch.Tensor, what: str, nan_for_inf: bool = False) -> None:
    """Equal to 1e-9 relative (to ``expected``'s largest finite magnitude, at least 1)
    where finite, with NaN, inf and -inf exactly where ``expected`` has them: a
    non-finite value facing a finite one fails either way round.

    ``nan_for_inf`` lets NaN face +-inf (never a finite value), for gradients of layers
    that reassociate a linear map with a sum: ``x (sum g)`` and ``sum (x g)`` differ
    there once ``x`` is infinite (inf * (1 - 1) = NaN, inf * 1 - inf * 1 = NaN but
    inf * 2 = inf), though both are equally correct float arithmetic.
    """
    finite = expected[torch.isfinite(expected)]
    scale = max(finite.abs().max().item() if finite.numel() else 0.0, 1.0)
    if nan_for_inf:
        assert torch.equal(torch.isfinite(actual), torch.isfinite(expected)), f"{what}: finite at other positions"
        both_inf = torch.isinf(actual) & torch.isinf(expected)
        assert torch.equal(actual[both_inf], expected[both_inf]), f"{what}: infinities of other signs"
        keep = torch.isfinite(expected)
        actual, expected = actual[keep], expected[keep]
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-9 * scale, equal_nan=True,
                               msg=lambda message: f"{what}: {message}")


def assert_gatv2_matches_pyg(device: str, in_channels: int, channels: int, heads: int, edge_dim: int | None,
                             src: torch.Tensor, dst: torch.Tensor, num_nodes: int):
    """gnnfuse's GATv2Conv against PyG's with copied float64 weights, on outputs and all
    gradients; returns (the layer's call on x, x) for checks of the plan it ran."""
    import torch_geometric.nn as pyg
    from gnnfuse import nn as gnn
    ours = gnn.GATv2Conv(in_channels, channels, heads=heads, edge_dim=edge_dim).double().to(device)
    ref = pyg.GATv2Conv(in_channels, channels, heads=heads, edge_dim=edge_dim).double().to(device)
    ref.load_state_dict(ours.state_dict())
    edge_index = torch.stack([src, dst]).to(device)
    attr = None if edge_dim is None else torch.randn(len(src), edge_dim, dtype=torch.float64, device=device)
    x = torch.randn(num_nodes, in_channels, dtype=torch.float64, device=device)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index, attr),
                                  lambda xs: ref(xs, edge_index, attr), x)
    return (lambda xs: ours(xs, edge_index, attr)), x


def assert_compiled_matches(ours: torch.nn.Module, theirs: torch.nn.Module,
                            run: Callable[[torch.nn.Module], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]) -> None:
    """``run(layer)`` gives a layer's output and its gradients: gnnfuse's layer must run
    a compiled program (not PyG's fallback) and agree with its twin to 1e-10 relative
    (float64) on the output and every gradient."""
    with record_calls() as calls:
        out, grads = run(ours)
    assert calls, "no compiled program ran"
    want_out, want_grads = run(theirs)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def assert_same_under_autocast(ours: torch.nn.Module, ref: torch.nn.Module,
                               call: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor], x: torch.Tensor,
                               device_type: str = "cpu") -> None:
    """``call(layer, x)`` under bfloat16 autocast for both layers: the same output dtype,
    and output and input gradient (of ``sum(out ** 2)``) within bfloat16's tolerance, 3e-2
    of the largest magnitude (fused kernels round at each store, eager code after each op)."""
    results = []
    for layer in (ours, ref):
        xs = x.clone().requires_grad_()
        with torch.autocast(device_type, dtype=torch.bfloat16):
            out = call(layer, xs)
        out.float().square().sum().backward()
        results.append((out, xs.grad))
    (out, grad), (ref_out, ref_grad) = results
    assert out.dtype == ref_out.dtype
    for a, b in [(out, ref_out), (grad, ref_grad)]:
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2 * b.abs().max().item())
