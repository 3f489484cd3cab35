"""A layer of one's own: attention biased by an edge feature, written vertex-centrically.

Each in-edge e = (u -> v) carries a feature s_e, here the cosine similarity of the raw
input features of u and v. The layer scores it as

    score_e = exp(tanh(<a_src, z_u> + <a_dst, z_v> + beta * s_e))

with a learned scalar beta saying how much the similarity should count, normalises over
v's in-edges and aggregates the z_u. Nothing in gnnfuse knows this layer; the compiler
fuses it from the vertex function like any other. The script trains a two-layer model and
prints the learned beta (positive: the model learned to trust similar neighbours more).

    python examples/custom_attention.py [--epochs 30]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import gnnfuse
from common import load, parse_epochs, train


@gnnfuse.vertex
def similarity_attention(v):
    scores = [torch.exp(torch.tanh(e.src.el + v.er + e.sim * e.beta)) for e in v.inedges]
    alpha = [s / sum(scores) for s in scores]
    z = [e.src.z for e in v.inedges]
    return sum([alpha[i] * z[i] for i in range(len(v.inedges))])


class SimilarityAttention(nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim)
        self.att_src = nn.Parameter(torch.randn(out_dim) * 0.1)
        self.att_dst = nn.Parameter(torch.randn(out_dim) * 0.1)
        self.beta = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, graph: gnnfuse.Graph, sim: torch.Tensor) -> torch.Tensor:
        z = self.lin(x)
        el, er = (z * self.att_src).sum(-1, keepdim=True), (z * self.att_dst).sum(-1, keepdim=True)
        beta = self.beta.expand(graph.num_edges, 1)   # an edge input, so e.beta lines up with e.sim
        return similarity_attention(graph, {"z": z, "el": el, "er": er}, {"sim": sim, "beta": beta})


class Model(nn.Module):
    def __init__(self, in_dim: int, hidden: int, num_classes: int, sim: torch.Tensor):
        super().__init__()
        self.conv1, self.conv2 = SimilarityAttention(in_dim, hidden), SimilarityAttention(hidden, num_classes)
        self.register_buffer("sim", sim)

    def forward(self, x: torch.Tensor, graph: gnnfuse.Graph) -> torch.Tensor:
        x = F.relu(self.conv1(F.dropout(x, 0.5, self.training), graph, self.sim))
        return self.conv2(F.dropout(x, 0.5, self.training), graph, self.sim)


if __name__ == "__main__":
    epochs = parse_epochs(__doc__.splitlines()[0])
    torch.manual_seed(0)
    data = load()
    src, dst = data.graph.src.long(), data.graph.dst.long()
    sim = F.cosine_similarity(data.x[src], data.x[dst]).unsqueeze(-1)
    model = Model(data.x.shape[1], 16, data.num_classes, sim)
    print(f"similarity attention on synthetic: {data.graph.num_edges} edges, mean edge similarity "
          f"{sim.mean().item():.3f}")
    train(model, data, epochs)
    print(f"learned beta: layer 1 {model.conv1.beta.item():+.3f}, layer 2 {model.conv2.beta.item():+.3f}")
