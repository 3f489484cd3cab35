"""The GAT of gat_vertex.py written as DGL-style message/reduce functions.

The message function builds each edge's attention logit from its endpoints; the reduce
function takes the softmax over the mailbox and the weighted sum. Both front ends trace
into the same IR, so the two layers must agree: this script first loads the vertex
model's weights into the message model and checks their outputs match (float64), then
trains the message model.

    python examples/gat_message.py [--epochs 30]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import gnnfuse
from common import load, parse_epochs, train
from gat_vertex import GAT, GATLayer


class MessageGATLayer(GATLayer):
    """Same parameters as `GATLayer`; only the graph part is written differently."""

    def aggregate(self, graph: gnnfuse.Graph, z: torch.Tensor, el: torch.Tensor, er: torch.Tensor) -> torch.Tensor:
        def message(edges):
            return {"score": F.leaky_relu(edges.src["el"] + edges.dst["er"], 0.2), "z": edges.src["z"]}

        def reduce(nodes):
            alpha = torch.softmax(nodes.mailbox["score"], dim=1)
            return {"out": torch.sum(alpha.unsqueeze(-1) * nodes.mailbox["z"], dim=1)}

        return gnnfuse.message_passing(graph, message, reduce, ndata={"z": z, "el": el, "er": er})["out"]


if __name__ == "__main__":
    epochs = parse_epochs(__doc__.splitlines()[0])
    torch.manual_seed(0)
    data = load()
    vertex_model = GAT(data.x.shape[1], 8, 4, data.num_classes).double().eval()
    message_model = GAT(data.x.shape[1], 8, 4, data.num_classes, layer=MessageGATLayer).double().eval()
    message_model.load_state_dict(vertex_model.state_dict())
    with torch.no_grad():
        x = data.x.double()
        expected, actual = vertex_model(x, data.graph), message_model(x, data.graph)
    diff = (actual - expected).abs().max().item()
    print(f"message/reduce vs vertex-centric GAT, same weights: max |difference| = {diff:.2e}")
    if not torch.allclose(actual, expected, rtol=1e-9, atol=1e-9):
        raise SystemExit("the message/reduce GAT disagrees with the vertex-centric one")
    train(message_model.float(), data, epochs, lr=0.005)
