"""WN18RR, a real WordNet knowledge graph: the relational data set for typed layers."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..graph import Graph
from .dataset import DataFileError, RelationalDataset, reading
from .paths import find_data_folder

SPLITS = ("train", "valid", "test")


def _triples(path: Path) -> np.ndarray:
    """The file's ``head<TAB>relation<TAB>tail`` lines as an [n, 3] array of strings.

    Fields are stripped of surrounding whitespace (a trailing space or a CRLF line end
    kept in an id would make ``"00001740 "`` an entity of its own beside ``"00001740"``,
    silently splitting one synset in two, where PyG's loader splits on whitespace) and
    blank lines are skipped. A line of another shape (spaces for tabs, a missing
    column) or with an empty field is refused by its number: regrouping the columns
    into other triples, or taking ``""`` for a relation, would be a silently wrong graph.
    """
    with reading(path, "WN18RR triples, head<TAB>relation<TAB>tail per line"):
        # utf-8-sig: a byte-order mark (a file saved by a Windows editor) is not whitespace
        # to strip(), and would have made the first head id an entity of its own
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split("\t")]
        if len(fields) != 3 or not all(fields):
            raise DataFileError(f"{path}, line {number}: {line[:120]!r} has {len(fields)} tab-separated "
                                f"column(s){' with an empty one' if len(fields) == 3 else ''}; expected "
                                "head<TAB>relation<TAB>tail")
        rows.append(fields)
    return np.array(rows, dtype=str).reshape(-1, 3)


def load_wn18rr(root: str | os.PathLike | None = None) -> RelationalDataset:
    """Load WN18RR: 40,943 entities, 11 relations; the graph holds the training triples.

    Entities are numbered in sorted order of their synset id strings (leading zeros kept)
    and relations in sorted name order, so ids do not depend on file order. Only training
    triples become edges (head -> tail, typed by relation), the usual setting for link
    prediction; every entity of every split is a vertex.
    """
    folder = find_data_folder("wn18rr", [f"{split}.txt" for split in SPLITS], root)     # all splits from one
    raw = {split: _triples(folder / f"{split}.txt") for split in SPLITS}
    everything = np.concatenate(list(raw.values()))
    entities = np.unique(np.concatenate([everything[:, 0], everything[:, 2]]))
    relations = np.unique(everything[:, 1])

    def encode(triples: np.ndarray) -> torch.Tensor:
        ids = np.stack([np.searchsorted(entities, triples[:, 0]),
                        np.searchsorted(relations, triples[:, 1]),
                        np.searchsorted(entities, triples[:, 2])], axis=1)
        return torch.from_numpy(ids.astype(np.int64))

    train, valid, test = (encode(raw[s]) for s in SPLITS)
    graph = Graph(train[:, 0], train[:, 2], len(entities),
                  edge_type=train[:, 1], num_edge_types=len(relations))
    return RelationalDataset(
        name="wn18rr", graph=graph, entity_ids=entities.tolist(), relation_names=relations.tolist(),
        train_triples=train, valid_triples=valid, test_triples=test,
        description=f"WN18RR (WordNet): typed edges head -> tail from the training triples; read from {folder}")
