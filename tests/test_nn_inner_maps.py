"""What users attach to a layer's linear maps runs as in PyG, whose layers call the maps.

gnnfuse's layers move a map where it costs less (after the aggregation, folded into the
attention logits or an edge kernel, into a GEMM with another map's bias), reading its
``weight`` instead of calling it (`nn.plain_linear`). A forward hook or pre-hook, the
old ``torch.nn.utils.weight_norm`` (a pre-hook recomputing the weight), a hook for every
module, a subclass with its own ``forward`` (a LoRA adapter) or another module in the
map's place were skipped there: outputs off by up to 9.5 with no error, or an internal
AttributeError. Each case is compared with the PyG layer given the same change, in
float64: output, and every parameter's gradient. The input needs no gradient, as a
first layer's, which is where the layers aggregate before mapping."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch_geometric.nn as pyg
from torch import nn

from gnnfuse import nn as gnn

N, F_IN, F_OUT = 12, 8, 5
EDGE_INDEX = torch.randint(0, N, (2, 40), generator=torch.Generator().manual_seed(0))
EDGE_ATTR = torch.randn(40, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


class LowRankAdapted(nn.Linear):
    """A LoRA-style map: ``nn.Linear``'s output plus ``x A B``."""

    def __init__(self, lin: nn.Module):
        super().__init__(lin.in_features, lin.out_features, bias=lin.bias is not None, dtype=torch.float64)
        with torch.no_grad():
            self.weight.copy_(lin.weight)
            if lin.bias is not None:
                self.bias.copy_(lin.bias)
        gen = torch.Generator().manual_seed(2)
        self.a = nn.Parameter(torch.randn(lin.in_features, 2, generator=gen, dtype=torch.float64))
        self.b = nn.Parameter(torch.randn(2, lin.out_features, generator=gen, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + x @ self.a @ self.b


def _hooked(layer: nn.Module, name: str) -> None:
    _submodule(layer, name).register_forward_hook(lambda module, inputs, out: out * 2 + 0.5)


def _pre_hooked(layer: nn.Module, name: str) -> None:
    _submodule(layer, name).register_forward_pre_hook(lambda module, inputs: (inputs[0] * 3,))


def _weight_normed(layer: nn.Module, name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        lin = torch.nn.utils.weight_norm(_submodule(layer, name))
    with torch.no_grad():
        lin.weight_g.mul_(3.0)         # as an optimizer step would: the weight is remade in the pre-hook


def _spectral_normed(layer: nn.Module, name: str) -> None:
    """A parametrized weight: each read of ``weight`` runs a power iteration in training
    mode (updating its ``u``, ``v`` buffers), so a read beyond the call PyG makes changes
    the weight used (SAGEConv read ``lin_l``'s and ``lin_r``'s, GATConv and GATv2Conv
    ``lin_edge``'s, once more per call: outputs off by up to 0.09 on the first call)."""
    torch.manual_seed(4)          # the same starting vectors in both layers
    torch.nn.utils.parametrizations.spectral_norm(_submodule(layer, name))


def _weight_norm_parametrized(layer: nn.Module, name: str) -> None:
    """torch's current ``weight_norm``, a parametrization of two tensors (``original0``,
    ``original1``, no ``original``): GATConv and GATv2Conv with ``edge_dim`` failed on it
    in ``edge_rows`` with "'ParametrizationList' object has no attribute 'original'",
    where PyG's layers run."""
    lin = torch.nn.utils.parametrizations.weight_norm(_submodule(layer, name))
    with torch.no_grad():
        lin.parametrizations.weight.original0.mul_(3.0)


def _adapted(layer: nn.Module, name: str) -> None:
    _replace(layer, name, LowRankAdapted(_submodule(layer, name)))


def _replaced(layer: nn.Module, name: str) -> None:
    lin = _submodule(layer, name)
    plain = nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None, dtype=torch.float64)
    plain.load_state_dict({key: value for key, value in lin.state_dict().items()})
    _replace(layer, name, nn.Sequential(plain, nn.Tanh()))


def _submodule(layer: nn.Module, name: str) -> nn.Module:
    return layer.get_submodule(name)


def _replace(layer: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(layer.get_submodule(parent) if parent else layer, leaf, module)


CHANGES = {"forward-hook": _hooked, "pre-hook": _pre_hooked, "weight-norm": _weight_normed, "lora": _adapted,
           "sequential": _replaced, "spectral-norm": _spectral_normed,
           "weight-norm-parametrization": _weight_norm_parametrized}
# (layer, constructor arguments, the map changed, whether it takes edge_attr)
MAPS = [
    ("GCNConv", {}, "lin", False),
    ("SAGEConv", {}, "lin_l", False),
    ("SAGEConv", {}, "lin_r", False),
    ("SAGEConv", {"aggr": "max"}, "lin_r", False),
    ("SAGEConv", {"project": True}, "lin_l", False),
    ("GATConv", {"heads": 2}, "lin", False),
    ("GATConv", {"heads": 2, "edge_dim": 3}, "lin_edge", True),
    ("GATConv", {"heads": 2, "residual": True}, "lin", False),
    ("GATv2Conv", {"heads": 2, "edge_dim": 3}, "lin_edge", True),
    ("GraphConv", {}, "lin_rel", False),
    ("GraphConv", {}, "lin_root", False),
    ("SGConv", {"K": 2}, "lin", False),
    ("TAGConv", {"K": 2}, "lins.1", False),      # PyG calls it by forward: no hook runs, as in ours
    ("ChebConv", {"K": 3}, "lins.1", False),
    ("ChebConv", {"K": 3}, "lins.2", False),     # PyG calls lins[2:] by forward: no hook runs, as in ours
]


def _pair(layer: str, kwargs: dict) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = getattr(pyg, layer)(F_IN, F_OUT, **kwargs).double()
    ours = getattr(gnn, layer)(F_IN, F_OUT, **kwargs).double()
    ours.load_state_dict(ref.state_dict())
    return ours, ref


def _assert_same_outputs_and_parameter_grads(ours: nn.Module, ref: nn.Module, args: tuple) -> None:
    out, expected = ours(*args), ref(*args)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
    seed = torch.randn_like(expected)
    (out * seed).sum().backward()
    (expected * seed).sum().backward()
    ours_params, ref_params = dict(ours.named_parameters()), dict(ref.named_parameters())
    assert ours_params.keys() == ref_params.keys()
    for key, param in ours_params.items():
        if ref_params[key].grad is None:
            assert param.grad is None or not bool(param.grad.any()), key
        else:
            torch.testing.assert_close(param.grad, ref_params[key].grad, rtol=1e-9, atol=1e-12, msg=key)


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("layer, kwargs, name, edge_features", MAPS,
                         ids=[f"{layer}-{name}-{'-'.join(map(str, kwargs.values())) or 'default'}"
                              for layer, kwargs, name, _ in MAPS])
def test_a_changed_map_runs_as_in_pyg(layer, kwargs, name, edge_features, change):
    if (layer, name) in (("TAGConv", "lins.1"), ("ChebConv", "lins.2")) and change == "weight-norm":
        pytest.skip(f"PyG's {layer} calls {name} by forward, skipping weight_norm's pre-hook: its backward "
                    "then fails on the weight made before the update (as ours does, reading the same weight)")
    ours, ref = _pair(layer, kwargs)
    if change in ("lora", "sequential"):       # the same new module in both
        CHANGES[change](ours, name)
        _replace(ref, name, copy.deepcopy(_submodule(ours, name)))
    else:
        for module in (ours, ref):
            CHANGES[change](module, name)
    x = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    args = (x, EDGE_INDEX, EDGE_ATTR) if edge_features else (x, EDGE_INDEX)
    _assert_same_outputs_and_parameter_grads(ours, ref, args)


def test_a_hook_for_every_module_sees_the_maps_as_in_pyg():
    """``register_module_forward_hook`` doubles every linear map's output; PyG's maps are
    its own ``Linear`` class."""
    from torch_geometric.nn.dense.linear import Linear as PyGLinear
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, inputs, out: out * 2 if isinstance(module, (nn.Linear, PyGLinear)) else None)
    try:
        for layer, kwargs in (("GCNConv", {}), ("SAGEConv", {}), ("GATConv", {"heads": 2}), ("SGConv", {"K": 2})):
            ours, ref = _pair(layer, kwargs)
            x = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
            _assert_same_outputs_and_parameter_grads(ours, ref, (x, EDGE_INDEX))
    finally:
        handle.remove()


def test_mlp_aggregation_refuses_a_map_it_cannot_split():
    """MLPAggConv (FeatGraph's, no PyG counterpart) computes W (x_u + x_v) as W x_u + W x_v
    from the weight: a map with a hook is refused by name, not split."""
    layer = gnn.MLPAggConv(F_IN, F_OUT)
    layer.lin.register_forward_hook(lambda module, inputs, out: out.tanh())
    with pytest.raises(TypeError, match="MLPAggConv.lin must be a plain torch.nn.Linear"):
        layer(torch.randn(N, F_IN), EDGE_INDEX)
