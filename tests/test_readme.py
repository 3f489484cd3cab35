"""Every ```python block of README.md runs, so the README cannot drift from the code.

The blocks run in order in one namespace, as a reader following the README top to bottom
would type them: a later block may use names an earlier one defined (the message/reduce
example reuses the first example's `graph`). Each block is compiled under its README line
numbers, so a failure's traceback points into README.md.
"""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, source) of each ```python block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def test_readme_python_blocks_run_in_sequence(monkeypatch):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3
    # A real module, as a user's script is: PyG looks a MessagePassing subclass's module
    # up in sys.modules.
    module = types.ModuleType("readme")
    monkeypatch.setitem(sys.modules, "readme", module)
    for line, source in blocks:
        # padding keeps README line numbers in tracebacks
        exec(compile("\n" * (line - 1) + source, str(README), "exec"), module.__dict__)


def test_block_extraction_keeps_line_numbers():
    text = "intro\n```python\na = 1\n```\n\n```\nshell\n```\n```python\nb = a + 1\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (10, "b = a + 1\n")]


def test_every_environment_variable_read_is_documented():
    """A ``GNNFUSE_*`` variable the library reads changes what it does, so a user must be
    able to find it in the README; one the README names must still be read."""
    variable = re.compile(r"\bGNNFUSE_[A-Z0-9_]+\b")
    read = set()
    for source in (ROOT / "src" / "gnnfuse").rglob("*.py"):
        read |= set(variable.findall(source.read_text()))
    documented = set(variable.findall(README.read_text()))
    assert read - documented == set(), "read by src/gnnfuse but not in README.md"
    assert documented - read == set(), "named in README.md but read nowhere in src/gnnfuse"


def test_every_public_name_is_documented():
    """What ``gnnfuse`` and ``gnnfuse.nn`` export (their ``__all__``, and the PyG layers and
    models ``gnnfuse.nn`` builds on first access) is importable and named in the README, so a
    user can find each; `gnnfuse.compile` and the model registry's `get_model` were not."""
    import gnnfuse
    import gnnfuse.nn
    from gnnfuse.nn.pyg_layers import COMPILED_PYG_LAYERS, EAGER_PYG_LAYERS
    from gnnfuse.nn.pyg_models import PYG_MODELS
    text = README.read_text()
    names = {("gnnfuse", name) for name in gnnfuse.__all__ if name != "__version__"}
    names |= {("gnnfuse.nn", name) for name in (*gnnfuse.nn.__all__, *COMPILED_PYG_LAYERS, *EAGER_PYG_LAYERS, *PYG_MODELS,
                                                "MessagePassing", "compiled_class")}
    for module, name in sorted(names):
        assert getattr(sys.modules[module], name) is not None
    # a top-level name by its qualified spelling (``torch.compile`` is not ``gnnfuse.compile``);
    # a layer by its class name, as the README lists them
    spelled = {"gnnfuse": r"\bgnnfuse\.{}\b", "gnnfuse.nn": r"\b{}\b"}
    undocumented = sorted(f"{module}.{name}" for module, name in names
                          if not re.search(rf"`[^`]*{spelled[module].format(re.escape(name))}[^`]*`", text))
    assert undocumented == []


def test_every_benchmark_script_has_a_row_in_the_benchmarks_table():
    """benchmarks/README.md's table is where a script's purpose is found; four scripts
    (bench_pyg_layers, bench_loader, check_split_rows, launch_floor) had none."""
    folder = ROOT / "benchmarks"
    rows = set(re.findall(r"^\| `([^`]+)` \|", (folder / "README.md").read_text(), re.M))
    scripts = {path.name for path in (*folder.glob("*.py"), *folder.glob("*.sh"))} - {"common.py"}
    assert scripts - rows == set(), "benchmark scripts without a row in benchmarks/README.md"
    assert rows - scripts == set(), "rows of benchmarks/README.md naming no script"


def test_every_command_line_option_is_documented():
    """Each ``--option`` of every ``gnnfuse`` command is named in the README (``bench
    --frameworks/--steps/--warmup`` and ``tune --repeats`` were not)."""
    import argparse

    from gnnfuse.cli import _parser
    text = README.read_text()
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {option}" for name, parser in commands.choices.items() for action in parser._actions
               for option in action.option_strings
               if option.startswith("--") and option != "--help" and not re.search(rf"{option}\b", text)]
    assert missing == []


def test_every_data_set_and_model_the_cli_accepts_is_named():
    """``--dataset`` and ``--model`` take these names; the README's lists must keep up."""
    from gnnfuse.data import DATASET_NAMES
    from gnnfuse.nn import model_names
    text = README.read_text()
    missing = [name for name in (*DATASET_NAMES, *model_names(task=None)) if f"`{name}`" not in text]
    assert missing == []


def test_each_commands_options_are_named_in_its_own_command_line_entry():
    """The check above passes when an option's name appears anywhere in the README:
    ``bench --cuda-graph`` and ``--root``, ``explain --dot`` and ``--root``, ``tune --root``
    and ``train --gpus/--cpu-ranks/--features`` were missing from their commands' entries
    under "Command line", where a reader of ``--help`` looks them up. (``--threads`` is
    one entry for all commands.)"""
    import argparse

    from gnnfuse.cli import _parser
    text = README.read_text()
    section = text[text.index("## Command line"):text.index("## Examples")]
    entries = re.split(r"\n(?=- `gnnfuse )", section)
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, parser in commands.choices.items():
        entry = next((e for e in entries if e.startswith(f"- `gnnfuse {name}")), "")
        missing += [f"{name} {option}" for action in parser._actions for option in action.option_strings
                    if option.startswith("--") and option not in ("--help", "--threads")
                    and not re.search(rf"{option}\b", entry)]
    assert missing == []


def test_each_commands_synopsis_brackets_exactly_its_optional_options():
    """An entry under "Command line" opens with the command's synopsis; an option shown
    there is in brackets exactly when argparse does not require it (``tune --model`` was
    shown bare, as if required, though it defaults to gcn; ``tune --dataset`` is required)."""
    import argparse

    from gnnfuse.cli import _parser
    text = README.read_text()
    section = text[text.index("## Command line"):text.index("## Examples")]
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    wrong = []
    for name, parser in commands.choices.items():
        synopsis = re.search(rf"^- `gnnfuse {name}\b([^`]*)`", section, re.M)
        assert synopsis, f"no entry for gnnfuse {name}"
        words = synopsis.group(1)
        bracketed = " ".join(re.findall(r"\[[^\]]*\]", words))
        for action in parser._actions:
            for option in (o for o in action.option_strings if o.startswith("--")):
                if not re.search(rf"{option}\b", words):
                    continue
                if action.required == bool(re.search(rf"{option}\b", bracketed)):
                    wrong.append(f"{name} {option} ({'required' if action.required else 'optional'})")
    assert wrong == []


def _synopsis_options(words: str) -> dict[str, str]:
    """``--option VALUE`` pairs of a synopsis (``[--model gcn|gat|sage]`` -> ``gcn|gat|sage``)."""
    return dict(re.findall(r"(--[a-z][a-z-]*)[ =]([^\s\]]+)", words))


def test_each_commands_synopsis_shows_its_choices_and_defaults():
    """A synopsis value with ``|`` lists the option's choices (all of them, as argparse
    has them); a lower-case value without ``|`` or a file ending is its default
    (``explain [--dataset synthetic]``, ``bench [--dataset cora]``); upper-case values
    (``DIR``, ``N``) are placeholders."""
    import argparse

    from gnnfuse.cli import _parser
    text = README.read_text()
    section = text[text.index("## Command line"):text.index("## Examples")]
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    wrong, checked = [], 0
    for name, parser in commands.choices.items():
        words = re.search(rf"^- `gnnfuse {name}\b([^`]*)`", section, re.M).group(1)
        actions = {o: a for a in parser._actions for o in a.option_strings}
        for option, value in _synopsis_options(words).items():
            action = actions[option]
            if "|" in value:
                checked += 1
                if action.choices is not None and value.split("|") != list(action.choices):
                    wrong.append(f"{name} {option} {value}: choices {list(action.choices)}")
            elif value.islower() and "." not in value:
                checked += 1
                if value != str(action.default):
                    wrong.append(f"{name} {option} {value}: default {action.default!r}")
    assert checked >= 8
    assert wrong == []


def test_train_recipes_are_the_registry_defaults():
    """``--epochs``, ``--hidden``, ... default to each model's paper recipe, which the
    README spells out per model; the numbers it gives must be those of
    ``gnnfuse.nn.get_model(name).defaults``."""
    from gnnfuse.nn import get_model
    text = README.read_text()
    start = text.index("each defaults to the model's paper recipe (")
    recipes = " ".join(text[start:text.index(").", start)].split())
    fields = {"hidden": r"hidden (\S+?)[,;]|(\S+) hidden\b", "lr": r"\blr (\S+?)[,;]",
              "weight_decay": r"weight decay (\S+?)[,; ]", "dropout": r"dropout (\S+?)[,; ]",
              "epochs": r"(\d+) epochs", "patience": r"patience (\d+)"}
    wrong, checked = [], 0
    for name, recipe in re.findall(r"\b(GCN|GAT|SAGE|APPNP|SGC): (.*?)(?=; [A-Z]+:|$)", recipes):
        defaults = get_model(name.lower()).defaults
        for field, pattern in fields.items():
            found = re.search(pattern, recipe)
            if found:
                checked += 1
                stated = float(next(g for g in found.groups() if g))
                if stated != getattr(defaults, field):
                    wrong.append(f"{name} {field} {stated}: registry {getattr(defaults, field)}")
    assert checked >= 20
    assert wrong == []


def test_every_dotted_gnnfuse_name_resolves():
    """Each ``gnnfuse.a.b`` the README names (a module, function, class or attribute),
    and each ``Graph.x`` / ``HeteroGraph.x``, exists, so a reader can import what the
    manual points to; a rename must update the text."""
    import importlib

    import gnnfuse
    text = README.read_text()
    names = set(re.findall(r"\bgnnfuse(?:\.[A-Za-z_]\w*)+", text))
    names |= {f"gnnfuse.{m}" for m in re.findall(r"(?<![\w.])((?:Hetero)?Graph\.[A-Za-z_]\w*)", text)}
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
        if obj is None:
            missing.append(name)
    assert len(names) > 50 and gnnfuse.HeteroGraph.from_data
    assert missing == []


# paths the README quotes that are not this repository's files
_NOT_OURS = {"examples/gcn.py", "examples/gat.py"}      # PyG's published examples


def test_every_file_path_the_readme_names_exists():
    """A quoted path with a folder in it (``passes/addmm.py``, ``tests/test_io_rule.py``,
    ``results/loss.md``) names a file of the repository, looked up from the root, under
    src/gnnfuse/ or under benchmarks/; shortened result names (``_run2.md``) and
    placeholders (``$GNNFUSE_CACHE/...``, ``<folder>/...``) are not paths."""
    text = README.read_text()
    quoted = set(re.findall(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|md|sh|png|json))`", text))
    quoted |= set(re.findall(r"\(([\w-]+(?:/[\w.-]+)+\.(?:py|md|sh|png|json))\)", text))
    bases = (ROOT, ROOT / "src" / "gnnfuse", ROOT / "src", ROOT / "benchmarks")
    missing = sorted(p for p in quoted - _NOT_OURS if not any((base / p).is_file() for base in bases))
    assert len(quoted) > 30
    assert missing == []


_UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
          "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50}


def _number(word: str) -> int:
    """``"Twenty-nine"`` -> 29 (the README spells its counts of layers out)."""
    tens, _, unit = word.lower().partition("-")
    if tens in _TENS:
        return _TENS[tens] + (_UNITS.index(unit) if unit else 0)
    return _UNITS.index(tens)


def test_readme_layer_lists_are_the_code_lists():
    """"Coming from PyG" names the PyG layers gnnfuse.nn compiles, those it runs eagerly
    and those it refuses with advice, each with a count in words; adding or moving a
    layer in nn/pyg_layers.py must update the list and its count, and every layer the
    README says gnnfuse.nn has must be importable from it."""
    import gnnfuse.nn
    from gnnfuse.nn.pyg_layers import COMPILED_PYG_LAYERS, EAGER_PYG_LAYERS, NOT_EXPORTED
    text = README.read_text()

    def quoted(start: str, end: str) -> tuple[str, list[str]]:
        a = text.index(start)
        return text[a:a + 40], re.findall(r"`(\w+)`", text[a:text.index(end, a)])

    head, names = quoted("- Twenty-nine more of PyG's layers", "from `gnnfuse.nn` are PyG's own")
    assert set(names) == set(COMPILED_PYG_LAYERS) and len(names) == len(set(names))
    assert _number(head.split()[1]) == len(COMPILED_PYG_LAYERS)
    head, names = quoted("Eight more import the same way", "Importing any other PyG convolution")
    layers = [n for n in names if n.endswith("Conv")]
    assert set(layers) == set(EAGER_PYG_LAYERS) and _number(head.split()[0]) == len(EAGER_PYG_LAYERS)
    _, names = quoted("Importing any other PyG convolution", "cugraph and DGL layers")
    named = {n for n in names if n.endswith("Conv")}
    others = {n for n in NOT_EXPORTED if n.startswith("CuGraph") or n == "FusedGATConv"}  # "cugraph and DGL"
    assert named | others == set(NOT_EXPORTED)
    _, names = quoted("- `from torch_geometric.nn import GCNConv` (or", "becomes `from gnnfuse.nn import")
    _, more = quoted("`gnnfuse.nn` has `GCNConv`", "`gnnfuse.nn.build_model")
    assert set(names) <= set(more)       # the two lists of layers with PyG's arguments agree
    assert [n for n in {*names, *more} if n.endswith("Conv") or n == "APPNP"
            if n not in gnnfuse.nn.__all__] == []
