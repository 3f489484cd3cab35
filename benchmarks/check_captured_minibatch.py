"""GPU check of mini-batch steps replayed from a CUDA graph (`BlockStepCapture`): the
same training as eager steps on unpadded batches.

For each block model (SAGE, GAT; 3 layers, no dropout) and the same seeds, one run
trains eagerly on a plain `NeighborLoader`'s batches and one through `BlockStepCapture`
on a ``static_shapes=True`` loader's padded batches (the first steps eager, then
replays; the epoch's last, smaller batch replayed too, ``short_batches="replay"``). Both
loaders draw the same batches, so per-batch losses and the final weights (SGD with
momentum) must agree to float32 summation order (the padded blocks' whole-row segments
sum a row in another order than split ones): max |loss difference| and max relative
weight difference are printed with PASS/FAIL (tolerance 1e-3), and how many steps were
replayed; SAGE runs on complete padded batches and on deferred ones (rows and layouts
built in the replayed step), GAT on both too (its self loops on a padded block are built
in fixed shapes inside the step, `nn.padded_loops`, and replayed). Then, with dropout
0.5, the losses of two consecutive epochs of replays must differ from batch to batch as
an eager run's do (fresh masks per replay).

    python benchmarks/check_captured_minibatch.py            # power-law graph, 200k nodes, on cuda
"""
from __future__ import annotations

import argparse
import sys

import torch

from gnnfuse.data.synthetic import power_law_graph
from gnnfuse.loader import NeighborLoader
from gnnfuse.nn.block_models import build_block_model
from gnnfuse.training.captured_step import BlockStepCapture
from gnnfuse.training.minibatch import classification_step

TOLERANCE = 1e-3


def train(kind: str, data, args, captured: bool, dropout: float = 0.0, epochs: int = 1, deferred: bool = False):
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = build_block_model(kind, data.x.shape[1], int(data.y.max()) + 1, args.hidden, dropout, 3).to(device)
    # SGD: Adam's normalisation turns summation-order noise in a near-zero gradient into
    # a visible weight difference (7.7% after 12 steps here), which would hide real errors
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = NeighborLoader(data.graph.to(device), [10, 5, 5], args.batch_size, input_nodes=data.train_mask,
                            shuffle=True, x=data.x.to(device), y=data.y.to(device), device=device,
                            static_shapes=captured, deferred=deferred)
    step = classification_step(model, optimizer)
    run = BlockStepCapture(step, optimizers=[optimizer], modules=[model], mode="on",
                           features=loader.features, short_batches="replay") if captured else step
    torch.manual_seed(1)
    losses = [float(run(batch)) for _ in range(epochs) for batch in loader]
    return losses, [p.detach().clone() for p in model.parameters()], run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args(argv)
    data = power_law_graph(args.nodes, 15 * args.nodes, 64, 10, seed=0)
    data.train_mask[args.nodes // 10:] = False          # a few dozen batches per epoch
    failed = False
    for kind, deferred in (("sage", False), ("sage", True), ("gat", False), ("gat", True)):
        eager, eager_weights, _ = train(kind, data, args, False)
        replayed, weights, run = train(kind, data, args, True, deferred=deferred)
        loss_error = max(abs(a - b) for a, b in zip(eager, replayed))
        weight_error = max(float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))
                           for a, b in zip(eager_weights, weights))
        ok = len(eager) == len(replayed) and loss_error < TOLERANCE and weight_error < TOLERANCE and run.replayed > 0
        failed |= not ok
        print(f"{kind}{', deferred' if deferred else ''}: {len(replayed)} steps, {run.replayed} replayed, {run.eager} eager ({run.status}); "
              f"max |loss diff| {loss_error:.2e}, max rel weight diff {weight_error:.2e}: {'PASS' if ok else 'FAIL'}")
    losses, _, run = train("sage", data, args, True, dropout=0.5, epochs=2, deferred=True)
    repeats = sum(a == b for a, b in zip(losses, losses[1:]))
    ok = repeats == 0 and run.replayed > 0
    failed |= not ok
    print(f"sage, dropout 0.5: {run.replayed} replayed; consecutive equal losses {repeats}: {'PASS' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
