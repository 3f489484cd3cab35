"""Refusing torch.jit.script by name.

TorchScript compiles a module's Python source into its own language. gnnfuse's layers call
compiled programs, generated kernels and Python objects (graphs, traced functions) that
it cannot express, so scripting one stopped on whatever construct it met first --
"Unknown type annotation: 'Graph | None'", "Lambda aren't supported", "Can't get source
for gnnfuse.nn.TransformerConv" -- none of which says scripting is the problem.
torch.jit.script calls ``__prepare_scriptable__`` on the module and each submodule first,
so a model holding a gnnfuse layer anywhere is refused there, naming the layer.
"""
from __future__ import annotations

from typing import NoReturn


class NotScriptable:
    """Mixin for gnnfuse's modules: torch.jit.script refuses them with a message."""

    def __prepare_scriptable__(self) -> NoReturn:
        raise NotImplementedError(
            f"torch.jit.script cannot compile gnnfuse's {type(self).__name__}: its forward runs gnnfuse's "
            "generated kernels, which TorchScript cannot express. Use torch.compile (fullgraph=True works), "
            "or keep the model eager")
