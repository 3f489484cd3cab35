"""Link prediction (training/link_prediction.py, nn/link_models.py): the filtered ranking
against a brute-force oracle, negatives, a tiny knowledge graph learnt by R-GCN and RGAT
with DistMult, and the model/data-set pairing errors of `gnnfuse train`."""
from __future__ import annotations

import math

import pytest
import torch

from gnnfuse.cli import main
from gnnfuse.graph import Graph
from gnnfuse.nn.models import get_model, model_names
from gnnfuse.training import ConfigError, make_config
from gnnfuse.training.link_prediction import (EVAL_EVERY, LinkData, corrupt, filtered_ranks, ranking_metrics,
                                              train_link_run)
from gnnfuse.nn.link_models import with_inverse_relations


def brute_force_ranks(scores: torch.Tensor, queries: torch.Tensor, known: torch.Tensor, num_relations: int):
    """Rank of each query's answer among entities that are not another known answer,
    tail queries then head queries; ties count half."""
    known_set = {tuple(t) for t in known.tolist()}
    ranks = []
    for tail in (True, False):
        for h, r, t in queries.tolist():
            anchor, target = (h, t) if tail else (t, h)
            row = scores[anchor, r]
            others = [e for e in range(row.shape[0]) if e != target
                      and ((anchor, r, e) if tail else (e, r, anchor)) not in known_set]
            above = sum(float(row[e]) > float(row[target]) for e in others)
            ties = sum(float(row[e]) == float(row[target]) for e in others)
            ranks.append(1 + above + 0.5 * ties)
    return torch.tensor(ranks, dtype=torch.float64)


@pytest.mark.parametrize("overflowed", [False, True])
def test_filtered_ranks_match_a_brute_force_oracle(overflowed):
    """``overflowed``: the lowest scores are -inf (an overflow), true answers' among them;
    filtering known answers by a -inf score counted them all as ties of such an answer."""
    g = torch.Generator().manual_seed(0)
    entities, relations = 9, 2
    known = _random_triples(entities, relations, 25, g)
    queries = known[::3]
    # symmetric per-relation scores (as DistMult's are), rounded so that ties occur
    scores = torch.randint(0, 4, (entities, relations, entities), generator=g).double()
    scores = scores + scores.transpose(0, 2)
    if overflowed:
        scores[scores <= 2] = float("-inf")
    got = filtered_ranks(lambda a, r: scores[a, r], queries, known, relations)
    torch.testing.assert_close(got, brute_force_ranks(scores, queries, known, relations))


def test_a_query_missing_from_the_filter_does_not_tie_with_itself():
    """Filtering by the training triples alone leaves the validation queries out of
    ``known``: each true answer then counted as a tie of itself, rank 1.5 for a
    query whose answer scores highest (MRR 0.67, not 1.0)."""
    g = torch.Generator().manual_seed(1)
    entities, relations = 8, 2
    known = _random_triples(entities, relations, 20, g)
    queries = torch.tensor([[0, 0, 1], [3, 1, 5], [7, 0, 7]])
    scores = torch.randint(0, 3, (entities, relations, entities), generator=g).double()
    scores = scores + scores.transpose(0, 2)
    got = filtered_ranks(lambda a, r: scores[a, r], queries, known, relations)
    torch.testing.assert_close(got, brute_force_ranks(scores, queries, known, relations))
    best = filtered_ranks(lambda a, r: torch.nn.functional.one_hot(1 - a, 4).double(),
                          torch.tensor([[0, 0, 1]]), torch.tensor([[2, 0, 3]]), 1)
    assert best.tolist() == [1.0, 1.0]


def test_scoring_everything_alike_ranks_in_the_middle_not_first():
    known = torch.tensor([[0, 0, 1], [2, 0, 3]])
    ranks = filtered_ranks(lambda a, r: torch.zeros(len(a), 11), known, known, 1)
    mrr, hits = ranking_metrics(ranks)
    assert bool((ranks == 1 + 0.5 * 10).all()) and mrr == pytest.approx(1 / 6) and hits == 1.0


def test_nan_scores_have_no_rank_not_the_first():
    """NaN compares false with everything, so a diverged model's queries all ranked
    first: MRR 1.0 and Hits@10 1.0, kept as the best epoch."""
    known = torch.tensor([[0, 0, 1], [2, 0, 3]])
    nan_row = lambda a, r: torch.where(a[:, None] == 0, float("nan"), torch.arange(11.0).expand(len(a), 11))  # noqa: E731
    ranks = filtered_ranks(nan_row, known, known, 1)
    assert bool(ranks.isnan().any()) and not bool(ranks[~ranks.isnan()].eq(1).all())
    assert math.isnan(ranking_metrics(ranks)[0])


def _random_triples(entities: int, relations: int, count: int, g: torch.Generator) -> torch.Tensor:
    """Distinct (head, relation, tail) rows drawn from ``g``."""
    return torch.unique(torch.stack([torch.randint(0, entities, (count,), generator=g),
                                     torch.randint(0, relations, (count,), generator=g),
                                     torch.randint(0, entities, (count,), generator=g)], 1), dim=0)


def _tiny_link_data() -> LinkData:
    """24 entities, 3 relations; valid and test are training triples."""
    entities, relations = 24, 3
    train = _random_triples(entities, relations, 60, torch.Generator().manual_seed(0))
    graph = Graph(train[:, 0], train[:, 2], entities, edge_type=train[:, 1], num_edge_types=relations)
    return LinkData("tiny", with_inverse_relations(graph), train, train[:20], train[20:40], train, entities, relations)


def test_a_diverged_link_run_stops_and_reports_nan_not_a_perfect_mrr():
    config = make_config("rgcn", "wn18rr", epochs=10, hidden=8, lr=1e13, dropout=0.0, patience=None)
    with pytest.warns(RuntimeWarning, match="training diverged at epoch"):
        result = train_link_run(config, get_model("rgcn"), _tiny_link_data(), seed=0, log_epochs=False)
    assert math.isnan(result.best_val_acc) and math.isnan(result.test_acc)
    assert result.epochs_run < 10


def test_link_patience_is_judged_at_validated_epochs_only():
    """Validation runs every few epochs: patience 2 once stopped two epochs after the
    first validation, without validating again."""
    config = make_config("rgcn", "wn18rr", epochs=12, hidden=8, lr=0.0, dropout=0.0, patience=2)
    result = train_link_run(config, get_model("rgcn"), _tiny_link_data(), seed=0, log_epochs=False)
    assert len(result.history["val_mrr"]) >= 2 and result.epochs_run % EVAL_EVERY == 0


def test_negatives_replace_exactly_one_endpoint():
    triples = torch.tensor([[0, 1, 2]] * 200)
    negative = corrupt(triples, 50, torch.Generator().manual_seed(0))
    head_changed, tail_changed = negative[:, 0] != 0, negative[:, 2] != 2
    assert not bool((head_changed & tail_changed).any()) and torch.equal(negative[:, 1], triples[:, 1])
    assert head_changed.any() and tail_changed.any()


@pytest.mark.parametrize("model", ["rgcn", "rgat"])
def test_a_tiny_knowledge_graph_is_learnt(model):
    """Valid and test are training triples: a working encoder + decoder learns them, far
    above the random MRR (~0.16 with 24 entities: the mean of 1/rank over ranks 1..23)."""
    data = _tiny_link_data()
    config = make_config(model, "wn18rr", epochs=40, hidden=16, lr=0.05, dropout=0.0, patience=0)
    result = train_link_run(config, get_model(model), data, seed=0, log_epochs=False)
    assert result.metric == "MRR" and result.best_val_acc > 0.4 and result.test_acc > 0.4
    assert result.history["loss"][-1] < 0.6 * result.history["loss"][0]


def test_link_models_need_a_relational_data_set_and_full_graph_training(capsys):
    assert "rgcn" not in model_names() and {"rgcn", "rgat"} <= set(model_names(task=None))
    with pytest.raises(ConfigError, match="relational data set"):
        make_config("rgcn", "cora")
    with pytest.raises(ConfigError, match="--fanout does not apply"):
        make_config("rgat", "wn18rr", fanout=(5,))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--model", "rgcn", "--dataset", "synthetic"])
    assert exit_info.value.code == 2 and "relational data set" in capsys.readouterr().err


def test_a_link_run_stopped_by_ctrl_c_resumes_bit_exactly(monkeypatch):
    """A link run lost its epochs on Ctrl-C (R-GCN on wn18rr: ~30 s an epoch on CPU).
    It now stops at the end of the epoch with its state -- weights, Adam, torch's RNG and
    the negatives' generator, the best validation and the curves -- and goes on from it."""
    import signal

    from gnnfuse.training import link_prediction
    from gnnfuse.training.interrupt import RunInterrupted
    # lr 0.3: the best validation (epoch 5) comes before the Ctrl-C and is never beaten after it
    config = make_config("rgcn", "wn18rr", epochs=14, hidden=8, lr=0.3, dropout=0.2, patience=None)
    whole = train_link_run(config, get_model("rgcn"), _tiny_link_data(), seed=0, log_epochs=False)
    calls, real = [], link_prediction.peak_memory_mib

    def peak(device):
        calls.append(device)
        if len(calls) == 7:
            signal.raise_signal(signal.SIGINT)
        return real(device)
    with monkeypatch.context() as patch:
        patch.setattr(link_prediction, "peak_memory_mib", peak)
        with pytest.raises(RunInterrupted) as stopped:
            train_link_run(config, get_model("rgcn"), _tiny_link_data(), seed=0, log_epochs=False)
    assert stopped.value.state["epoch"] == 7
    resumed = train_link_run(config, get_model("rgcn"), _tiny_link_data(), seed=0, log_epochs=False,
                             resume_from=stopped.value.state)
    assert whole.best_epoch < 7
    assert resumed.history == whole.history and resumed.best_epoch == whole.best_epoch
    assert resumed.test_acc == whole.test_acc
    assert all(torch.equal(resumed.state_dict[k], v) for k, v in whole.state_dict.items())


def test_cuda_graph_on_with_a_link_model_warns_that_its_steps_run_eagerly(monkeypatch):
    """README: ``--cuda-graph on`` warns when it cannot capture; link runs dropped the mode
    without a word."""
    from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning
    from gnnfuse.training import link_prediction, train_runs
    monkeypatch.setattr(link_prediction, "prepare_link_data", lambda config: _tiny_link_data())
    with pytest.warns(CaptureFallbackWarning, match="link-prediction"):
        train_runs(make_config("rgcn", "wn18rr", epochs=1, hidden=8), log_epochs=False, cuda_graph="on")


def test_inverse_relations_of_an_untyped_graph_are_refused_by_name():
    """It failed on ``None + None`` (a TypeError about NoneType)."""
    graph = Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    with pytest.raises(ValueError, match="with_inverse_relations: the graph has no edge types"):
        with_inverse_relations(graph)



def test_inverse_relations_keep_node_types_and_refuse_a_bipartite_graph():
    """Node types were dropped, and a bipartite graph failed in Graph's constructor with an
    edge count error that named neither the function nor the cause."""
    src, dst, etype = torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([0, 1])
    typed = Graph(src, dst, 3, edge_type=etype, node_type=torch.tensor([0, 1, 1]), num_node_types=2)
    both = with_inverse_relations(typed)
    assert both.node_type.tolist() == [0, 1, 1] and both.num_node_types == 2 and both.num_edge_types == 4
    assert both.src.tolist() == [0, 1, 1, 2] and both.edge_type.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"with_inverse_relations: the graph is bipartite \(2 sources, 3 dest"):
        with_inverse_relations(Graph(src, dst, 3, edge_type=etype, num_src_nodes=2))


def test_hits_at_10_counts_rank_10_and_not_a_tie_past_it():
    """Hits@10 is the share ranked 10 or better: rank 10 counts, 10.5 (a tie straddling
    it) and 11 do not (``< 10`` had passed the suite)."""
    ranks = torch.tensor([1.0, 10.0, 10.5, 11.0], dtype=torch.float64)
    mrr, hits = ranking_metrics(ranks)
    assert hits == 0.5
    assert mrr == pytest.approx((1 + 1 / 10 + 1 / 10.5 + 1 / 11) / 4, rel=1e-12)
