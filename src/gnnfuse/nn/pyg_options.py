"""PyG's ``MessagePassing`` keyword arguments, as gnnfuse's layers take them.

PyG's layers pass ``**kwargs`` on to ``MessagePassing``: ``aggr``, ``flow``,
``node_dim``, ``decomposed_layers``. Code that spells one out at the value the layer
computes with (``GCNConv(16, 16, aggr="add")``) must build the same layer here; it got
Python's bare "unexpected keyword argument". Any other value would compute something
else, and is refused by name."""
from __future__ import annotations

from typing import Any

# the values gnnfuse's layers compute with (node_dim -2 and 0 are the node axis of [N, F] features)
_TAKEN = {"flow": ("source_to_target",), "node_dim": (-2, 0), "decomposed_layers": (1,)}


def message_passing_options(layer: str, kwargs: dict[str, Any], aggr: tuple[str, ...] = ("add", "sum")) -> int:
    """Accept ``kwargs`` (PyG ``MessagePassing`` options given to ``layer``) where they
    name what the layer computes -- ``aggr`` among ``aggr`` (empty for a layer whose
    ``aggr`` is an argument of its own) -- and raise a TypeError naming every other one,
    and any name that is no such option (a typo). Returns the ``node_dim`` given (-2 by
    default), as PyG keeps it on the layer: 0 names the node axis of [N, F] features
    only, and a layer taking [B, N, F] features refuses them with it."""
    taken = {**({"aggr": aggr} if aggr else {}), **_TAKEN}
    refused = [f"{name}={value!r}" for name, value in kwargs.items() if value not in taken.get(name, ())]
    if refused:
        options = ", ".join(f"{name}={values[0]!r}" for name, values in taken.items())
        raise TypeError(f"{layer}: {', '.join(refused)} {'is' if len(refused) == 1 else 'are'} not taken: "
                        f"gnnfuse's {layer} takes PyG's MessagePassing options only at the values it computes "
                        f"with ({options}), and has no other argument of that name")
    return kwargs.get("node_dim", -2)
