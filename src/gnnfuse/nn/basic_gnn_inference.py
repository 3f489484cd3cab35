"""PyG's layer-wise ``BasicGNN.inference(loader)`` for gnnfuse's `NeighborLoader`.

PyG's idiom for full-neighbourhood inference on a large graph is
``model.inference(subgraph_loader)`` with a one-hop loader over every vertex: each layer
runs over all vertices in batches before the next begins. PyG's method starts with
``assert isinstance(loader, torch_geometric.loader.NeighborLoader)`` and then reads that
loader's ``data`` and ``node_sampler``, so ``gnnfuse.nn.GraphSAGE(...).inference`` of a
gnnfuse loader failed with a bare ``AssertionError()`` naming nothing. Here the same loop
runs over gnnfuse's batches (``n_id``, ``batch_size``, ``edge_index``), each layer through
PyG's own ``inference_per_layer``; a PyG loader goes to PyG's method unchanged.

The layer's outputs are stacked in batch order as the next layer's input rows, so the
batches' seeds must be every vertex in id order: PyG leaves a shuffled loader unchecked
(its rows then belong to other vertices); this refuses it, and the other loaders PyG
asserts against, with what to change.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn


def inference_method(pyg_inference: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``inference`` for gnnfuse's model classes: PyG's ``pyg_inference`` for PyG's
    ``NeighborLoader``, `_gnnfuse_loader_inference` for gnnfuse's. gnnfuse's loader is
    known by what it holds (``seeds``, ``num_neighbors``), not by its class: ``loader/``
    builds on ``nn/``, so ``nn/`` does not import it."""

    def inference(self: nn.Module, loader: Any, device: torch.device | str | None = None,
                  embedding_device: torch.device | str = "cpu", progress_bar: bool = False,
                  cache: bool = False) -> torch.Tensor:
        from torch_geometric.loader import NeighborLoader as PyGNeighborLoader
        if isinstance(loader, PyGNeighborLoader):
            return pyg_inference(self, loader, device, embedding_device, progress_bar, cache)
        if not all(hasattr(loader, name) for name in ("seeds", "num_neighbors", "features")):
            raise TypeError(f"{type(self).__name__}.inference takes a NeighborLoader (PyG's or gnnfuse's) "
                            f"with num_neighbors=[-1] over every vertex, not {type(loader).__name__}")
        with torch.no_grad():
            return _gnnfuse_loader_inference(self, loader, device, embedding_device, progress_bar, cache)

    inference.__doc__ = pyg_inference.__doc__
    return inference


def _check_loader(model: nn.Module, loader: Any) -> None:
    """What PyG's ``inference`` asserts, and that the batches' seeds are every vertex in
    order (their outputs become the next layer's rows by position)."""
    name = type(model).__name__
    if model.jk_mode not in (None, "last"):
        raise ValueError(f"{name}.inference runs one layer over every vertex before the next, so it cannot "
                         f"combine layers: jk={model.jk_mode!r} needs jk=None or 'last'")
    if model.training:
        raise ValueError(f"{name}.inference is for evaluation: call model.eval() first")
    if len(loader.num_neighbors) != 1:
        raise ValueError(f"{name}.inference runs each layer on one-hop batches: the NeighborLoader samples "
                         f"{len(loader.num_neighbors)} hops (num_neighbors={list(loader.num_neighbors)}); use "
                         "num_neighbors=[-1]")
    every_vertex = torch.arange(loader.num_nodes, device=loader.seeds.device)
    if loader.shuffle or loader.sampler is not None or not torch.equal(loader.seeds, every_vertex):
        raise ValueError(f"{name}.inference stacks each batch's outputs as the next layer's rows, so the "
                         f"loader's seeds must be every vertex in id order: build the NeighborLoader without "
                         "input_nodes, shuffle or sampler")
    if loader.drop_last and loader.num_nodes % loader.batch_size:
        raise ValueError(f"{name}.inference needs a row for every vertex: the NeighborLoader has "
                         f"drop_last=True, which drops the last {loader.num_nodes % loader.batch_size} vertices")
    if loader.features is None:
        raise ValueError(f"{name}.inference reads the vertex features from the loader, which was built without "
                         "x: give the Data an x, or x= to the NeighborLoader")


def _gnnfuse_loader_inference(model: nn.Module, loader: Any, device: torch.device | str | None,
                              embedding_device: torch.device | str, progress_bar: bool,
                              cache: bool) -> torch.Tensor:
    """PyG's ``BasicGNN.inference`` loop over a gnnfuse loader's batches: ``cache`` keeps
    the first pass's batches (graph, ids) for the later layers, as PyG's ``CachedLoader``
    keeps its samples."""
    _check_loader(model, loader)
    bar = None
    if progress_bar:
        from tqdm import tqdm
        bar = tqdm(total=model.num_layers * len(loader), desc="Inference")
    x_all = loader.features.to(embedding_device)
    batches = list(loader) if cache else None
    for layer in range(model.num_layers):
        outputs = []
        for batch in (batches if batches is not None else loader):
            x = x_all[batch.n_id.to(x_all.device)].to(device)
            out = model.inference_per_layer(layer, x, batch.edge_index.to(device), batch.batch_size)
            outputs.append(out.to(embedding_device))
            if bar is not None:
                bar.update(1)
        x_all = torch.cat(outputs, dim=0)
    if bar is not None:
        bar.close()
    return x_all
