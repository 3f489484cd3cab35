"""Link prediction on a relational data set (WN18RR): what ``gnnfuse train --model rgcn
--dataset wn18rr`` runs.

Every epoch is one full-graph step: the encoder runs over the training triples (with
inverse relations), every training triple is a positive and gets one negative with its
head or its tail (half each) replaced by a uniformly random entity, and the loss is the
binary cross-entropy of their DistMult scores plus `REGULARIZATION` times the mean
square of the entity representations and relation diagonals (R-GCN's link-prediction
recipe, with one negative instead of ten to keep a CPU epoch short). Without the penalty
the learnt embeddings memorise the training triples: the loss falls while validation MRR
falls with it.

Evaluation is the standard *filtered* ranking (Bordes et al. 2013): each validation or
test triple is asked both ways, ``(h, r, ?)`` and ``(?, r, t)``; every entity is scored,
the other known true answers (from the training, validation and test triples) are
removed, and the true answer's rank is 1 + the entities scored above it + half of those
scored equal (so a model that scores everything alike ranks at the middle, not first).
MRR is the mean of 1/rank and Hits@10 the share ranked 10 or better, over both
directions. Validation runs every `EVAL_EVERY` epochs (a full ranking costs more than a
training step); the best validation MRR's weights are kept and tested once at the end.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..data import LOAD_ERRORS, RelationalDataset, load_dataset
from ..graph import Graph
from ..nn.link_models import with_inverse_relations
from ..nn.models import ModelSpec, build_model
from ..progress import progress_bar
from .config import ConfigError, TrainConfig
from .interrupt import DeferredInterrupt, RunInterrupted
from .loop import RunResult, _optimizer, peak_memory_mib, warn_diverged

EVAL_EVERY = 5
REGULARIZATION = 0.01
QUERY_BATCH = 512


@dataclass(frozen=True)
class LinkData:
    """A relational data set on the training device: the encoder's graph and the triples."""
    name: str
    graph: Graph
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    known: torch.Tensor            # every true triple, for the filtered ranking
    num_entities: int
    num_relations: int


def prepare_link_data(config: TrainConfig) -> LinkData:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device cuda, but CUDA is not available to this torch ({torch.__version__})")
    try:
        dataset = load_dataset(config.dataset, config.root)
    except LOAD_ERRORS as error:
        raise ConfigError(str(error)) from None
    if not isinstance(dataset, RelationalDataset):
        raise ConfigError(f"model {config.model!r} predicts links of a relational data set (wn18rr); "
                          f"{config.dataset} is a node-classification one")
    device = torch.device(config.device)
    splits = [t.to(device) for t in (dataset.train_triples, dataset.valid_triples, dataset.test_triples)]
    return LinkData(dataset.name, with_inverse_relations(dataset.graph).to(device), *splits,
                    known=torch.cat(splits), num_entities=dataset.graph.num_nodes,
                    num_relations=dataset.graph.num_edge_types)


def corrupt(triples: torch.Tensor, num_entities: int, generator: torch.Generator) -> torch.Tensor:
    """One negative per triple: its head (even rows of a random half) or tail replaced."""
    negative = triples.clone()
    count = len(triples)
    random = torch.randint(num_entities, (count,), generator=generator).to(triples.device)
    head = (torch.rand(count, generator=generator) < 0.5).to(triples.device)
    negative[:, 0] = torch.where(head, random, triples[:, 0])
    negative[:, 2] = torch.where(head, triples[:, 2], random)
    return negative


def filtered_ranks(scores_of, queries: torch.Tensor, known: torch.Tensor, num_relations: int) -> torch.Tensor:
    """Filtered ranks of ``queries`` [Q, 3] asked for their tail, then for their head
    ([2Q]); ``scores_of(anchor, relation)`` gives [B, entities] scores."""
    ranks = []
    for anchor_col, target_col in ((0, 2), (2, 0)):
        query_key = queries[:, anchor_col] * num_relations + queries[:, 1]
        known_key = known[:, anchor_col] * num_relations + known[:, 1]
        for start in range(0, len(queries), QUERY_BATCH):
            batch = queries[start:start + QUERY_BATCH]
            key, target = query_key[start:start + QUERY_BATCH], batch[:, target_col]
            scores = scores_of(batch[:, anchor_col], batch[:, 1])
            true_score = scores.gather(1, target[:, None])
            # every known answer of each query, the true one included, leaves the ranking:
            # by a mask, not a -inf score, which tied with a true score of -inf
            relevant = torch.isin(known_key, key)
            rows, cols = (key[:, None] == known_key[relevant][None, :]).nonzero(as_tuple=True)
            ranked = torch.ones_like(scores, dtype=torch.bool)
            ranked[rows, known[relevant][cols, target_col]] = False
            # and the true answer itself, known or not: a query missing from `known` (the
            # training triples alone passed as the filter) tied with itself, rank + 0.5
            ranked[torch.arange(len(batch), device=scores.device), target] = False
            above = ((scores > true_score) & ranked).sum(1)
            ties = ((scores == true_score) & ranked).sum(1)
            # a NaN score compares false with everything: it would rank first, and a
            # diverged model would report a perfect MRR; its rank is NaN instead
            unranked = (torch.isnan(scores) & ranked).any(1) | torch.isnan(true_score[:, 0])
            ranks.append(torch.where(unranked, float("nan"), 1 + above + 0.5 * ties))
    return torch.cat(ranks).double()


def ranking_metrics(ranks: torch.Tensor) -> tuple[float, float]:
    """(MRR, Hits@10)."""
    return (1.0 / ranks).mean().item(), (ranks <= 10).double().mean().item()


def evaluate(model, data: LinkData, queries: torch.Tensor) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        z = model(data.graph)
        ranks = filtered_ranks(lambda a, r: model.query_scores(z, a, r), queries, data.known, data.num_relations)
    return ranking_metrics(ranks)


def train_link_run(config: TrainConfig, spec: ModelSpec, data: LinkData, seed: int, *, label: str = "",
                   log_epochs: bool = True, resume_from: dict[str, Any] | None = None) -> RunResult:
    """One seed: train, validate every `EVAL_EVERY` epochs (and at the last), keep the
    best validation MRR's weights, stop after ``config.patience`` epochs without a better
    one, and test those weights. Returns a `RunResult` whose metric is the MRR.

    Ctrl-C ends the run at the end of its epoch with `RunInterrupted`, whose state passed
    back as ``resume_from`` continues the run exactly (as `loop.train_run`)."""
    device = torch.device(config.device)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = build_model(config.model, data.num_entities, data.num_relations, config.hidden,
                        config.dropout).to(device)
    optimizer = _optimizer(spec, model, config)
    history: dict[str, list[float]] = {"loss": [], "val_mrr": [], "val_hits10": []}
    best = (-1.0, 0, {})
    done = 0
    if resume_from is not None:
        done, best = restore_link_run(resume_from, model, optimizer, generator, history)
    start = time.perf_counter() - (0.0 if resume_from is None else resume_from["seconds"])
    progress = progress_bar(range(done + 1, config.epochs + 1), desc=f"train{label}", unit="epoch")
    with DeferredInterrupt(terminate=True) as interrupt:
        for epoch in progress:
            epoch_start = time.perf_counter()
            model.train()
            optimizer.zero_grad(set_to_none=True)
            z = model(data.graph)
            negative = corrupt(data.train, data.num_entities, generator)
            scores = torch.cat([model.score(z, data.train), model.score(z, negative)])
            targets = torch.cat([torch.ones(len(data.train)), torch.zeros(len(negative))]).to(scores)
            loss = F.binary_cross_entropy_with_logits(scores, targets) + REGULARIZATION * (
                z.pow(2).mean() + model.relation.pow(2).mean())
            loss.backward()
            optimizer.step()
            epoch_ms = (time.perf_counter() - epoch_start) * 1e3
            history["loss"].append(loss.item())
            if not math.isfinite(history["loss"][-1]):
                warn_diverged(epoch, f"loss {history['loss'][-1]}", best[1])
                break
            line = (f"epoch {epoch:4d} | loss {loss.item():.4f} | {epoch_ms:7.1f} ms | "
                    f"peak {peak_memory_mib(device):.0f} MiB")
            validated = epoch % EVAL_EVERY == 0 or epoch == config.epochs
            if validated:
                mrr, hits = evaluate(model, data, data.valid)
                history["val_mrr"].append(mrr)
                history["val_hits10"].append(hits)
                line += f" | val MRR {mrr:.4f} | val Hits@10 {hits:.4f}"
                if mrr > best[0]:
                    best = (mrr, epoch, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
                progress.set_postfix(loss=f"{loss.item():.4f}", val_mrr=f"{mrr:.4f}")
            if log_epochs:
                tqdm.write(f"{label.strip() + ' | ' if label else ''}{line}", file=sys.stdout)
            # patience counts epochs, but only a validated epoch can say nothing improved
            if validated and config.patience is not None and epoch - best[1] >= config.patience and best[0] >= 0:
                break
            if interrupt.requested and epoch < config.epochs:
                progress.close()
                raise RunInterrupted({"epoch": epoch, "model": model.state_dict(),
                                      "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                                      "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                                      "generator": generator.get_state(), "history": history, "best": best,
                                      "seconds": time.perf_counter() - start})
    progress.close()
    best_mrr, best_epoch, state = best
    if state:
        model.load_state_dict(state)
        test_mrr, test_hits = evaluate(model, data, data.test)
    else:               # no validation gave a finite MRR: there are no weights to test
        best_mrr, test_mrr, test_hits = float("nan"), float("nan"), float("nan")
    history["test_hits10"] = [test_hits]
    if log_epochs:
        tqdm.write(f"{label.strip() + ' | ' if label else ''}test (filtered, epoch {best_epoch}'s weights): "
                   f"MRR {test_mrr:.4f} | Hits@10 {test_hits:.4f}", file=sys.stdout)
    return RunResult(seed=seed, best_epoch=best_epoch, best_val_acc=best_mrr, test_acc=test_mrr,
                     epochs_run=len(history["loss"]), seconds=time.perf_counter() - start, state_dict=state,
                     history=history, cuda_graph="eager (link prediction)", metric="MRR",
                     interrupted=interrupt.requested)


def restore_link_run(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     generator: torch.Generator, history: dict[str, list[float]]
                     ) -> tuple[int, tuple[float, int, dict[str, torch.Tensor]]]:
    """Put a stopped link run's state back; returns its last epoch and its best
    (validation MRR, epoch, weights)."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None:
        torch.cuda.set_rng_state(state["cuda_rng"], next(model.parameters()).device)
    for key, values in state["history"].items():
        history[key][:] = values
    return state["epoch"], tuple(state["best"])
