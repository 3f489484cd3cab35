"""Layers written the way PyG's documentation teaches ("Creating Message Passing
Networks"), each built by a factory from a base class so one definition yields the
layer on PyG's ``MessagePassing`` and on ``gnnfuse.nn.MessagePassing`` -- a user's switch
of one import. ``make_layers(Base)`` returns {name: (class, compiles)}; ``compiles`` says
whether gnnfuse should run it compiled (False: it must fall back to PyG, with a warning)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.utils import scatter, softmax


def make_layers(Base: type) -> dict[str, tuple[type, bool]]:
    class EdgeWeighted(Base):
        """Edge-conditioned messages: each neighbour scaled by its edge's weight."""

        def __init__(self, channels_in: int, channels_out: int):
            super().__init__(aggr="add")
            self.lin = nn.Linear(channels_in, channels_out)

        def forward(self, x, edge_index, edge_weight):
            return self.propagate(edge_index, x=self.lin(x), edge_weight=edge_weight)

        def message(self, x_j, edge_weight):
            return x_j * edge_weight.view(-1, 1)

    class Attention(Base):
        """GAT-style multi-head attention, normalised by PyG's softmax over each target's
        in-edges; node_dim=0 because features are [N, heads, channels]."""

        def __init__(self, channels_in: int, channels_out: int, heads: int = 2, negative_slope: float = 0.2):
            super().__init__(aggr="add", node_dim=0)
            self.heads, self.channels, self.negative_slope, self.dropout = heads, channels_out, negative_slope, 0.0
            self.lin = nn.Linear(channels_in, heads * channels_out, bias=False)
            self.att_src = nn.Parameter(torch.randn(1, heads, channels_out))
            self.att_dst = nn.Parameter(torch.randn(1, heads, channels_out))

        def forward(self, x, edge_index):
            h = self.lin(x).view(-1, self.heads, self.channels)
            alpha = ((h * self.att_src).sum(-1), (h * self.att_dst).sum(-1))
            return self.propagate(edge_index, x=h, alpha=alpha).view(-1, self.heads * self.channels)

        def message(self, x_j, alpha_j, alpha_i, index, ptr, size_i):
            alpha = F.leaky_relu(alpha_j + alpha_i, self.negative_slope)
            alpha = softmax(alpha, index, ptr, size_i)
            alpha = F.dropout(alpha, p=self.dropout, training=self.training)
            return x_j * alpha.unsqueeze(-1)

    class EdgeMLP(Base):
        """Messages gated by an MLP of the edge features, applied inside message()."""

        def __init__(self, channels_in: int, edge_dim: int, hidden: int = 4):
            super().__init__(aggr="add")
            self.edge_mlp = nn.Sequential(nn.Linear(edge_dim, hidden), nn.ReLU(), nn.Linear(hidden, channels_in))

        def forward(self, x, edge_index, edge_attr):
            return self.propagate(edge_index, x=x, edge_attr=edge_attr)

        def message(self, x_j, edge_attr):
            return x_j * torch.tanh(self.edge_mlp(edge_attr))

    class GINLike(Base):
        """GIN: sum the neighbours, then update with (1 + eps) * x + aggr through an MLP."""

        def __init__(self, channels_in: int, channels_out: int):
            super().__init__(aggr="add")
            self.eps = nn.Parameter(torch.tensor([0.25]))
            self.mlp = nn.Sequential(nn.Linear(channels_in, channels_out), nn.ReLU(),
                                     nn.Linear(channels_out, channels_out))

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j

        def update(self, aggr_out, x):
            return self.mlp((1 + self.eps) * x + aggr_out)

    class OwnAggregate(Base):
        """Overrides aggregate() with its own scatter: gnnfuse leaves it to PyG."""

        def __init__(self):
            super().__init__(aggr="add")

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return 2 * x_j

        def aggregate(self, inputs, index, dim_size):
            return scatter(inputs, index, dim=0, dim_size=dim_size, reduce="max")

    class EdgeConvLike(Base):
        """EdgeConv: max over mlp([x_i, x_j - x_i]), reading target and source rows."""

        def __init__(self, channels_in: int, channels_out: int):
            super().__init__(aggr="max")
            self.mlp = nn.Sequential(nn.Linear(2 * channels_in, channels_out), nn.ReLU(),
                                     nn.Linear(channels_out, channels_out))

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_i, x_j):
            return self.mlp(torch.cat([x_i, x_j - x_i], dim=-1))

    class MeanSAGE(Base):
        """GraphSAGE's mean layer, given (x_src, x_dst) as PyG's layers pass it."""

        def __init__(self, channels_in: int, channels_out: int):
            super().__init__(aggr="mean")
            self.lin_l = nn.Linear(channels_in, channels_out)
            self.lin_r = nn.Linear(channels_in, channels_out, bias=False)

        def forward(self, x, edge_index):
            return self.lin_l(self.propagate(edge_index, x=(x, x))) + self.lin_r(x)

    class MinReverse(Base):
        """min aggregation of relu(x_j - x_i) along reversed edges (flow target_to_source)."""

        def __init__(self):
            super().__init__(aggr="min", flow="target_to_source")

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_i, x_j):
            return torch.relu(x_j - x_i) + 0.5 * x_j

    class SoftmaxAggregated(Base):
        """PyG's softmax aggregation (``aggr="softmax"``) of projected neighbours; its
        temperature learnt per channel, or fixed with gradients stopped at the weights."""

        def __init__(self, channels_in: int, channels_out: int, aggr_kwargs: dict):
            super().__init__(aggr="softmax", aggr_kwargs=aggr_kwargs)
            self.lin = nn.Linear(channels_in, channels_out)

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=self.lin(x))

        def message(self, x_i, x_j):
            return x_j - 0.5 * x_i

    class Untraceable(Base):
        """Uses a tensor method the tracer has no op for: falls back, naming the line."""

        def __init__(self):
            super().__init__(aggr="add")

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j.cumsum(-1)

    return {"edge_weighted": (EdgeWeighted, True), "attention": (Attention, True), "edge_mlp": (EdgeMLP, True),
            "gin_like": (GINLike, True), "own_aggregate": (OwnAggregate, False),
            "edge_conv_like": (EdgeConvLike, True), "mean_sage": (MeanSAGE, True),
            "min_reverse": (MinReverse, True), "softmax_learnt": (SoftmaxAggregated, True),
            "softmax_semi_grad": (SoftmaxAggregated, True), "untraceable": (Untraceable, False)}


def scaled_in_a_function(Base: type) -> tuple[type, torch.Tensor]:
    """A layer class made anew by each call, as a sweep defining its layer in a loop makes
    one, whose ``message`` closes over a [1000, 100] tensor: the tests freeing such classes
    check that the class and the tensor both go with the last reference."""
    scale = torch.randn(1000, 100)

    class Scaled(Base):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j * scale[0, 0]
    return Scaled, scale
