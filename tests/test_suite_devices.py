"""A tripwire over the test suite itself: every test that forces the Triton backend must
place its graph and tensors with `device_for(backend)` (oracle_check.py) or the conftest
`device` fixture. On a CPU machine Triton's interpreter runs host tensors, so a test that
forgets passes here and fails only on a GPU machine, where the Triton backend refuses
CPU tensors (71 cases did at commit 0160383). The scan reads each test module's syntax
tree: a function that sets GNNFUSE_BACKEND to "triton" -- or to a variable, in a module
that can hand it "triton" -- or a test taking a fixture that does (conftest's `backend`
or the module's own), must name a device somewhere in its body. A tripwire, not a proof:
a test naming a device can still leave one tensor behind (the GPU run finds that)."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DEVICE_WORDS = ("device", "cuda", "DEVICE")


def _can_name_triton(source: str) -> bool:
    """The module spells "triton" as a string or uses a BACKENDS list (oracle_check's):
    only then can a variable it sets GNNFUSE_BACKEND to be "triton"."""
    return any(text in source for text in ('"triton"', "'triton'", "BACKENDS"))


def _forces_triton(fn: ast.FunctionDef, variable_may_be_triton: bool) -> bool:
    """``fn`` calls ``setenv("GNNFUSE_BACKEND", ...)`` with "triton" or a variable that may be it."""
    for node in ast.walk(fn):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setenv"
                and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "GNNFUSE_BACKEND"):
            value = node.args[1]
            if isinstance(value, ast.Constant) and value.value == "triton":
                return True
            if not isinstance(value, ast.Constant) and variable_may_be_triton:
                return True
    return False


def _is_fixture(fn: ast.FunctionDef) -> bool:
    return any("fixture" in ast.unparse(d) for d in fn.decorator_list)


def _takes_forcing_fixture(fn: ast.FunctionDef, fixtures: set[str]) -> bool:
    """A test with an argument that names a fixture forcing the backend (conftest's
    ``backend``, or one of the module's) and that no parametrize of its own supplies."""
    arguments = {a.arg for a in fn.args.args} & fixtures
    if not fn.name.startswith("test_") or not arguments:
        return False
    return not any("parametrize" in ast.unparse(d) and any(a in ast.unparse(d) for a in arguments)
                   for d in fn.decorator_list)


def host_only_triton_functions(source: str) -> list[str]:
    """``name:line`` of each function of ``source`` that runs Triton without naming a
    device. A fixture that forces the backend is not itself checked: the tests taking it are."""
    tree = ast.parse(source)
    variable_may_be_triton = _can_name_triton(source)
    lines = source.splitlines()
    functions = {fn: "\n".join(lines[fn.lineno - 1:fn.end_lineno]) for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))}
    forcing = {fn for fn, body in functions.items()
               if "GNNFUSE_BACKEND" in body and _forces_triton(fn, variable_may_be_triton)}
    fixtures = {"backend"} | {fn.name for fn in forcing if _is_fixture(fn)}
    return [f"{fn.name}:{fn.lineno}" for fn, body in functions.items()
            if (fn in forcing or _takes_forcing_fixture(fn, fixtures)) and not _is_fixture(fn)
            and not any(word in body for word in DEVICE_WORDS)]


def test_every_triton_test_places_its_tensors_with_device_for():
    found = [f"{path.name}::{name}" for path in sorted(TESTS.glob("test_*.py"))
             for name in host_only_triton_functions(path.read_text())]
    assert not found, ("these force the Triton backend on host tensors, which fails on a GPU machine: build the "
                       f"graph, layers and inputs on device_for(backend) or the `device` fixture: {found}")


def test_the_scan_finds_each_way_of_forcing_triton_on_host_tensors():
    forced_by_variable = ('CHOICES = ["reference", "triton"]\n'
                          "def check(backend, monkeypatch):\n"
                          '    monkeypatch.setenv("GNNFUSE_BACKEND", backend)\n'
                          "    x = torch.randn(3)\n")
    assert host_only_triton_functions(forced_by_variable) == ["check:2"]
    placed = forced_by_variable.replace("torch.randn(3)", "torch.randn(3).to(device_for(backend))")
    assert host_only_triton_functions(placed) == []
    never_triton = forced_by_variable.replace('"triton"', '"cpu"')
    assert host_only_triton_functions(never_triton) == []
    forced_by_name = 'def helper(monkeypatch):\n    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")\n'
    assert host_only_triton_functions(forced_by_name) == ["helper:1"]
    by_conftest_fixture = "def test_b(backend):\n    x = torch.randn(3)\n"
    assert host_only_triton_functions(by_conftest_fixture) == ["test_b:1"]
    parametrized = '@pytest.mark.parametrize("backend", ["reference"])\n' + by_conftest_fixture
    assert host_only_triton_functions(parametrized) == []
    by_module_fixture = ('@pytest.fixture(params=["reference", "triton"])\n'
                         "def any_backend(request, monkeypatch):\n"
                         '    monkeypatch.setenv("GNNFUSE_BACKEND", request.param)\n'
                         "def test_c(any_backend):\n    x = torch.randn(3)\n")
    assert host_only_triton_functions(by_module_fixture) == ["test_c:4"]
