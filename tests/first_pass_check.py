"""The first-pass tests' simulation of a GPU's default backend on any machine
(runtime/first_pass.py): `backend_name` answers "triton" for CPU tensors too (Triton's
interpreter runs them) -- in every module that imported it by name (the layers' order
choices, the padded loops, the loader's layouts) -- and each executor's runs are counted
by backend name (a program whose first pass ran under autograd: its forward, and torch's
backward of it when its gradient arrives)."""
from __future__ import annotations

import sys
from collections import Counter

from gnnfuse.graph.index_cache import clear_index_cache
from gnnfuse.runtime import compiled
from oracle_check import device_for

DEVICE = device_for("triton")


def triton_by_default(monkeypatch) -> Counter:
    """Triton as the device's default backend (as on a GPU), and a count of the
    executors' runs by backend name (forward and backward programs alike). The index
    cache starts empty: a graph of equal contents kept from another test is no new one."""
    clear_index_cache()
    monkeypatch.delenv("GNNFUSE_BACKEND", raising=False)
    if DEVICE == "cpu":
        real = compiled.backend_name
        for module in list(sys.modules.values()):     # and the modules that imported it by name
            if getattr(module, "backend_name", None) is real:
                monkeypatch.setattr(module, "backend_name", lambda on_cuda: "triton")
    counts: Counter = Counter()
    for name in ("reference", "triton"):
        real = compiled._EXECUTORS.get(name) or compiled._import_executor(name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setitem(compiled._EXECUTORS, name, counted)
    under_autograd = compiled.CompiledProgram._run_under_autograd

    def backward_counted(self, *args):
        """A program run under autograd has torch run its backward: one reference run
        more when its gradient arrives, as the executor's own backward run counts."""
        outputs = under_autograd(self, *args)
        out = next((t for t in outputs.values() if t.grad_fn is not None), None)
        if out is not None:
            out.register_hook(lambda grad: counts.update(["reference"]))
        return outputs
    monkeypatch.setattr(compiled.CompiledProgram, "_run_under_autograd", backward_counted)
    return counts
