"""The exception a package's ``__getattr__`` raises for a name it refuses with advice.

Two callers need different types. ``hasattr(module, name)`` and ``getattr(module, name,
default)`` -- PyG-style introspection -- swallow only an AttributeError: an ImportError
escapes them. ``from package import name`` turns an AttributeError into a bare "cannot
import name", dropping the advice; an ImportError reaches the user whole. No class can be
both (their instance layouts conflict), and the import statement swallows any
AttributeError anyway, so the type is chosen by who asks: for a package, an import line
first probes the name with ``hasattr`` from ``importlib._bootstrap._handle_fromlist``,
which is where an ImportError is raised; everywhere else it is an AttributeError carrying
the same message."""
from __future__ import annotations

import sys


def refusal(module: str, name: str, message: str) -> Exception:
    """What ``module.__getattr__(name)`` raises to refuse ``name`` with ``message``.

    Call it directly from the module's ``__getattr__``: it reads the frame that called
    that ``__getattr__``."""
    asker = sys._getframe(2)
    if asker.f_code.co_name == "_handle_fromlist" and asker.f_globals.get("__name__") == "importlib._bootstrap":
        return ImportError(message, name=module)
    return AttributeError(message, name=name, obj=sys.modules[module])
