"""The torch hooks a module call runs besides ``forward``: its own and those registered
for every module (``torch.nn.modules.module.register_module_forward_hook``, ...).

Compiled code computes a module's result without calling it, so each user of a module
asks here what that call would have run: the trace cache (a hooked module cannot be
snapshotted), a plain ``nn.Linear`` check, PyG's aggregation module, and the tracer's
refusal of backward hooks. One list of hook tables, so none of them misses a kind.
"""
from __future__ import annotations

from torch import nn

HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
# torch's tables for every module: dicts it fills in place (older torch lacks some)
_GLOBAL_TABLES = {name: getattr(nn.modules.module, f"_global{name}") for name in HOOK_TABLES
                  if hasattr(nn.modules.module, f"_global{name}")}
# the same tables as a tuple, for checks on a layer call's host path (`nn.plain_linear`,
# the trace cache's guards), where ``any(GLOBAL_HOOK_TABLES)`` costs no Python call of
# gnnfuse's: `registered_hooks` there put 6 calls back on a cached SAGE step
GLOBAL_HOOK_TABLES = tuple(_GLOBAL_TABLES.values())


def registered_hooks(module: nn.Module, tables: tuple[str, ...] = HOOK_TABLES) -> tuple[list[str], list[str]]:
    """(the tables among ``tables`` holding a hook of ``module``'s own, those holding one
    for every module), each named without its underscore (``forward_hooks``)."""
    own = [name.lstrip("_") for name in tables if getattr(module, name, None)]
    every = [name.lstrip("_") for name in tables if _GLOBAL_TABLES.get(name)]
    return own, every
