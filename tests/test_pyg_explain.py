"""PyG's explainers (`torch_geometric.explain`) on models with gnnfuse layers
(`gnnfuse.nn.pyg_explain`): edge masks reach PyG ``MessagePassing`` layers only, so an
explainer asking for them refuses a model with gnnfuse's own layers, naming them, where a
model mixing both got a silently wrong edge mask. Node masks, and PyG-class layers, run."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.explain import Explainer
from torch_geometric.explain.algorithm import AttentionExplainer, GNNExplainer, PGExplainer

import gnnfuse.nn as gnn

CONFIG = dict(mode="multiclass_classification", task_level="node", return_type="raw")
REFUSED = r"edge masks on \(or reads attention from\) torch_geometric.nn.MessagePassing layers only"


class TwoLayers(torch.nn.Module):
    def __init__(self, first: torch.nn.Module, second: torch.nn.Module) -> None:
        super().__init__()
        self.c1, self.c2 = first, second

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 12, (2, 40), generator=gen)
    return torch.randn(12, 5, dtype=torch.float64, generator=gen), edge_index[:, edge_index[0] != edge_index[1]]


def _explain(model: torch.nn.Module, algorithm, x, edge_index, **masks):
    torch.manual_seed(1)
    explainer = Explainer(model, algorithm=algorithm, explanation_type="model", model_config=CONFIG, **masks)
    return explainer(x, edge_index, index=3)


def test_edge_masks_on_a_model_mixing_gnnfuse_and_pyg_layers_are_refused_naming_the_gnnfuse_layer():
    x, edge_index = _inputs()
    mixed = TwoLayers(gnn.GCNConv(5, 8), gnn.SimpleConv(aggr="mean")).double()      # SimpleConv: PyG's class
    with pytest.raises(NotImplementedError, match=rf"GNNExplainer.*{REFUSED}.*GCNConv at c1"):
        _explain(mixed, GNNExplainer(epochs=2), x, edge_index, edge_mask_type="object")
    attention = TwoLayers(gnn.GATConv(5, 4, heads=2), gnn.TransformerConv(8, 3)).double().eval()
    with pytest.raises(NotImplementedError, match=rf"AttentionExplainer.*GATConv at c1"):
        _explain(attention, AttentionExplainer(), x, edge_index, edge_mask_type="object")


def test_pg_explainer_training_and_the_fidelity_forward_are_refused_too():
    x, edge_index = _inputs()
    model = TwoLayers(gnn.SAGEConv(5, 8), gnn.SAGEConv(8, 3)).double()
    algorithm = PGExplainer(epochs=1)
    Explainer(model, algorithm=algorithm, explanation_type="phenomenon", edge_mask_type="object",
              model_config=CONFIG)
    with pytest.raises(NotImplementedError, match=rf"PGExplainer.train.*SAGEConv at c1, SAGEConv at c2"):
        algorithm.train(0, model, x, edge_index, target=model(x, edge_index).argmax(-1), index=3)
    explainer = Explainer(model, algorithm=GNNExplainer(epochs=1), explanation_type="model", model_config=CONFIG,
                          node_mask_type="attributes")
    with pytest.raises(NotImplementedError, match=r"get_masked_prediction"):
        explainer.get_masked_prediction(x, edge_index, edge_mask=torch.ones(edge_index.shape[1]))


def test_set_masks_and_captum_models_are_refused_too():
    """PyG's ``set_masks`` (a custom explainer's call) and ``to_captum_model``'s forward,
    which calls it, skipped gnnfuse's layers silently: an edge mask's gradient 0.23 off
    the same model of PyG's layers."""
    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
    from torch_geometric.nn import to_captum_model
    x, edge_index = _inputs()
    model = TwoLayers(gnn.GCNConv(5, 8), gnn.LEConv(8, 2)).double()       # LEConv: PyG's class
    mask = torch.nn.Parameter(torch.zeros(edge_index.shape[1], dtype=torch.float64))
    with pytest.raises(NotImplementedError, match=rf"set_masks.*{REFUSED}.*GCNConv at c1"):
        set_masks(model, mask, edge_index, apply_sigmoid=True)
    clear_masks(model)
    captum = to_captum_model(model, mask_type="edge", output_idx=2)
    with pytest.raises(NotImplementedError, match=rf"set_masks.*GCNConv at c1"):
        captum(torch.full((1, edge_index.shape[1]), 0.5, dtype=torch.float64), x, edge_index)
    pyg_only = TwoLayers(pyg_nn.GCNConv(5, 8), pyg_nn.LEConv(8, 2)).double()
    set_masks(pyg_only, mask, edge_index, apply_sigmoid=True)     # a model PyG's masks reach: as before
    clear_masks(pyg_only)


def test_node_masks_and_pyg_class_layers_are_explained_as_pyg_explains_them():
    x, edge_index = _inputs()
    ours = TwoLayers(gnn.GCNConv(5, 8), gnn.GCNConv(8, 3))
    theirs = TwoLayers(pyg_nn.GCNConv(5, 8), pyg_nn.GCNConv(8, 3))
    ours.load_state_dict(theirs.state_dict())
    got, want = (_explain(m.double(), GNNExplainer(epochs=3), x, edge_index, node_mask_type="attributes")
                 for m in (ours, theirs))
    torch.testing.assert_close(got.node_mask, want.node_mask)
    ours = TwoLayers(gnn.TransformerConv(5, 4), gnn.SimpleConv(aggr="mean"))     # PyG's classes: masks reach them
    theirs = TwoLayers(pyg_nn.TransformerConv(5, 4), pyg_nn.SimpleConv(aggr="mean"))
    ours.load_state_dict(theirs.state_dict())
    with pytest.warns(UserWarning):     # eager PyG message passing in explain mode, said by gnnfuse
        got = _explain(ours.double(), GNNExplainer(epochs=3), x, edge_index, edge_mask_type="object")
    want = _explain(theirs.double(), GNNExplainer(epochs=3), x, edge_index, edge_mask_type="object")
    torch.testing.assert_close(got.edge_mask, want.edge_mask)


@pytest.mark.parametrize("first", ["gnnfuse.nn", "torch_geometric.explain"])
def test_the_refusal_holds_whichever_is_imported_first(first):
    """gnnfuse.nn does not import PyG's explain package (seconds): the guard is put on it
    when it is imported, or at once when it already was."""
    other = "torch_geometric.explain" if first == "gnnfuse.nn" else "gnnfuse.nn"
    script = f"""
import sys, torch, {first}
assert "{first}" != "gnnfuse.nn" or "torch_geometric.explain" not in sys.modules
import {other}
from torch_geometric.explain import Explainer
from torch_geometric.explain.algorithm import GNNExplainer
import gnnfuse.nn as gnn
model = gnn.GCNConv(4, 3)
explainer = Explainer(model, algorithm=GNNExplainer(epochs=1), explanation_type="model", edge_mask_type="object",
                      model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))
try:
    explainer(torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]]), index=1)
except NotImplementedError as exc:
    print("refused:", exc)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "refused: torch_geometric.explain's GNNExplainer" in done.stdout, done.stderr[-2000:]


def test_graph_mask_explainer_is_refused_even_for_node_masks_only():
    """GraphMaskExplainer gates the messages of ``MessagePassing`` layers whatever masks it
    is asked for: with node masks only (``edge_mask_type=None``) it crashed on gnnfuse's
    layers with PyG's bare ``IndexError: index 4 is out of range``, where the same model of
    PyG's layers is explained."""
    from torch_geometric.explain.algorithm import GraphMaskExplainer
    x, edge_index = _inputs()
    model = TwoLayers(gnn.GCNConv(5, 5), pyg_nn.GCNConv(5, 5))
    with pytest.raises(NotImplementedError, match=r"GraphMaskExplainer gates the messages of "
                                                  r"torch_geometric.nn.MessagePassing layers.*GCNConv at c1"):
        _explain(model, GraphMaskExplainer(2, epochs=1, log=False), x.float(), edge_index,
                 node_mask_type="attributes")
    pyg_only = TwoLayers(pyg_nn.GCNConv(5, 5), pyg_nn.GCNConv(5, 5))     # PyG's layers: explained as before
    assert _explain(pyg_only, GraphMaskExplainer(2, epochs=1, log=False), x.float(), edge_index,
                    node_mask_type="attributes").node_mask.shape == (12, 5)


def test_pg_explainer_training_called_with_keywords_is_refused_too():
    """``PGExplainer.train(epoch=..., model=..., ...)``, its arguments by keyword, passed
    the guard and failed inside PyG with a bare ``IndexError: list index out of range``."""
    x, edge_index = _inputs()
    model = TwoLayers(gnn.SAGEConv(5, 8), gnn.SAGEConv(8, 3))
    algorithm = PGExplainer(epochs=1)
    Explainer(model, algorithm=algorithm, explanation_type="phenomenon", edge_mask_type="object",
              model_config=CONFIG)
    target = model(x.float(), edge_index).argmax(-1)
    with pytest.raises(NotImplementedError, match=rf"PGExplainer.train.*SAGEConv at c1, SAGEConv at c2"):
        algorithm.train(epoch=0, model=model, x=x.float(), edge_index=edge_index, target=target, index=3)


def _hetero_inputs():
    gen = torch.Generator().manual_seed(4)
    x = {"a": torch.randn(5, 4, dtype=torch.float64, generator=gen),
         "b": torch.randn(3, 4, dtype=torch.float64, generator=gen)}
    edges = {("a", "to", "b"): torch.tensor([[0, 1, 2, 4], [0, 1, 2, 2]]),
             ("b", "to", "a"): torch.tensor([[0, 1, 2], [3, 4, 0]])}
    masks = {key: torch.rand(value.shape[1], dtype=torch.float64, generator=gen) for key, value in edges.items()}
    return x, edges, masks


def test_hetero_masks_reach_the_layers_of_a_gnnfuse_hetero_conv():
    """PyG's ``set_hetero_masks`` (to_captum_model's CaptumHeteroModel, custom explainers)
    finds a relation's layer by ``edge_type in module_dict``, which PyG's ModuleDict answers
    for a tuple; gnnfuse's HeteroConv held a torch ModuleDict, so its layers got no mask and
    no refusal: PyG's LEConvs inside came out unmasked (0.91 off PyG's HeteroConv)."""
    from torch_geometric.explain.algorithm.utils import clear_masks, set_hetero_masks
    x, edges, masks = _hetero_inputs()
    outputs = []
    for hetero_conv in (gnn.HeteroConv, pyg_nn.HeteroConv):
        torch.manual_seed(0)
        model = hetero_conv({key: pyg_nn.LEConv(4, 3) for key in edges}).double()
        set_hetero_masks(model, masks, edges, apply_sigmoid=False)
        outputs.append(model(x, edges))
        clear_masks(model)
    torch.testing.assert_close(outputs[0], outputs[1])
    ours = gnn.HeteroConv({("a", "to", "b"): gnn.SAGEConv((4, 4), 3), ("b", "to", "a"): pyg_nn.LEConv(4, 3)}).double()
    with pytest.raises(NotImplementedError, match=rf"set_masks.*{REFUSED}.*SAGEConv at the model itself"):
        set_hetero_masks(ours, masks, edges, apply_sigmoid=False)
