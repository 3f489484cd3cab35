"""A class built from another class once, kept by that class.

gnnfuse derives classes from its users' classes: `nn.compiled_class` subclasses a PyG
``MessagePassing`` class with the compiling ``propagate``, the graph loader subclasses an
``InMemoryDataset`` class with a batch ``__getitems__``. A cache keyed by the source class
(``functools.cache``) held both classes for the process, since the derived one subclasses
its key: a class defined in a loop or a function (a sweep's layer, a test's data set)
stayed alive with whatever its methods close over. Kept in the source class's own
``__dict__``, the two are one reference cycle, freed together.

The first build is made under a lock: two threads building a layer of the same class at
once (a server's pool) each made a class of their own, and the one whose class lost the
race got layers that were not ``isinstance`` of ``compiled_class(cls)`` and failed to
pickle ("it's not the same object as gnnfuse.nn.pyg_layers.compiled:...").
"""
from __future__ import annotations

import threading
from typing import Callable

# re-entrant, so a ``make`` that derives another class on its thread does not wait on itself
_BUILDING = threading.RLock()


def derived_class(cls: type, attribute: str, make: Callable[[], type]) -> type:
    """``make()``, built at the first call for ``cls`` and kept as ``cls``'s attribute
    ``attribute`` (its own, never a base class's, whose derived class is another)."""
    made = cls.__dict__.get(attribute)
    if made is not None:
        return made
    with _BUILDING:
        made = cls.__dict__.get(attribute)      # another thread may have built it meanwhile
        if made is None:
            made = make()
            setattr(cls, attribute, made)
    return made
