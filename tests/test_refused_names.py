"""A name gnnfuse.nn refuses (a PyG name that would run other code, or propagation gnnfuse
does not compile) is absent to ``hasattr`` and ``getattr(module, name, default)`` -- as
PyG-style introspection expects -- yet an import line or an attribute access naming it
still says why and what to use."""
from __future__ import annotations

import pytest

import gnnfuse.nn

# one name from each table gnnfuse.nn refuses from, and a word its advice holds
REFUSED = [("gcn_norm", "gnnfuse.nn.reference.gcn_norm"),     # other arguments (_NOT_PYG)
           ("SplineConv", "pyg-lib"),                          # a convolution not exported (NOT_EXPORTED)
           ("SAGPooling", "GNN=gnnfuse.nn.GraphConv")]         # builds PyG's propagation (NOT_REEXPORTED)


@pytest.mark.parametrize("name, advice", REFUSED)
def test_a_refused_name_is_absent_to_introspection(name, advice):
    assert not hasattr(gnnfuse.nn, name)
    sentinel = object()
    assert getattr(gnnfuse.nn, name, sentinel) is sentinel
    assert getattr(gnnfuse.nn, name, None) is None


@pytest.mark.parametrize("name, advice", REFUSED)
def test_an_import_line_naming_it_says_why(name, advice):
    with pytest.raises(ImportError, match=rf"gnnfuse.nn has no '{name}': .*{advice}"):
        exec(f"from gnnfuse.nn import {name}", {})
    with pytest.raises(ImportError, match=rf"gnnfuse.nn has no '{name}': .*{advice}"):
        exec(f"from gnnfuse.nn import GCNConv, {name}", {})


@pytest.mark.parametrize("name, advice", REFUSED)
def test_an_attribute_access_naming_it_says_why(name, advice):
    namespace: dict = {}
    exec("import gnnfuse.nn as n", namespace)
    with pytest.raises(AttributeError, match=rf"gnnfuse.nn has no '{name}': .*{advice}") as caught:
        exec(f"n.{name}", namespace)
    assert caught.value.name == name and caught.value.obj is gnnfuse.nn
