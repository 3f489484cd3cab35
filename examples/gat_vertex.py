"""GAT written vertex-centrically (Seastar's Figure 3), trained on the synthetic data set.

For one vertex v: score each in-neighbour u by exp(leaky_relu(<a_src, z_u> + <a_dst, z_v>)),
normalise by the sum over the neighbours, and add up the neighbours' z_u weighted by
those scores -- per head. The dense parts (z = x W and the per-vertex logits) stay in
torch; gnnfuse compiles the per-vertex function into fused gather-score-aggregate steps.

    python examples/gat_vertex.py [--epochs 30]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import gnnfuse
from common import load, parse_epochs, train


@gnnfuse.vertex
def gat_aggregate(v):
    scores = [torch.exp(F.leaky_relu(u.el + v.er, 0.2)) for u in v.innbs]
    alpha = [s / sum(scores) for s in scores]
    z = [u.z for u in v.innbs]
    return sum([alpha[i].unsqueeze(-1) * z[i] for i in range(len(v.innbs))])


class GATLayer(nn.Module):
    """One multi-head GAT layer; ``aggregate(graph, z, el, er)`` does the graph part, so
    gat_message.py can swap in its message/reduce version with the same parameters."""

    def __init__(self, in_dim: int, out_dim: int, heads: int, concat: bool = True):
        super().__init__()
        self.heads, self.out_dim, self.concat = heads, out_dim, concat
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.randn(heads, out_dim) * 0.1)
        self.att_dst = nn.Parameter(torch.randn(heads, out_dim) * 0.1)

    def aggregate(self, graph: gnnfuse.Graph, z: torch.Tensor, el: torch.Tensor, er: torch.Tensor) -> torch.Tensor:
        return gat_aggregate(graph, {"z": z, "el": el, "er": er})

    def forward(self, x: torch.Tensor, graph: gnnfuse.Graph) -> torch.Tensor:
        z = self.lin(x).view(-1, self.heads, self.out_dim)
        out = self.aggregate(graph, z, (z * self.att_src).sum(-1), (z * self.att_dst).sum(-1))
        return out.flatten(1) if self.concat else out.mean(1)


class GAT(nn.Module):
    def __init__(self, in_dim: int, hidden: int, heads: int, num_classes: int, layer: type = GATLayer):
        super().__init__()
        self.conv1 = layer(in_dim, hidden, heads)
        self.conv2 = layer(hidden * heads, num_classes, 1, concat=False)

    def forward(self, x: torch.Tensor, graph: gnnfuse.Graph) -> torch.Tensor:
        x = F.dropout(x, 0.5, self.training)
        x = F.elu(self.conv1(x, graph))
        return self.conv2(F.dropout(x, 0.5, self.training), graph)


if __name__ == "__main__":
    epochs = parse_epochs(__doc__.splitlines()[0])
    torch.manual_seed(0)
    data = load()
    model = GAT(data.x.shape[1], 8, 4, data.num_classes)
    print(f"vertex-centric GAT on synthetic: {data.graph.num_nodes} nodes, {data.graph.num_edges} edges")
    train(model, data, epochs, lr=0.005)
