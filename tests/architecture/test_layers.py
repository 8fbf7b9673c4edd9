"""vacsr's one layer order (docs/architecture.md): a module imports only from its own layer or
the layers below it, never from one above, counting every import in its source (inside functions
and TYPE_CHECKING blocks too). A new module must be given a layer here before it can pass."""
from __future__ import annotations

from tests.architecture.source_imports import PACKAGE, imports_in, vacsr_modules

# lowest first, a layer a line: its name, then its entries. "pkg.*" is the package and everything
# in it; any other entry is that module only. Each module matches exactly one entry: there is no
# precedence between entries to learn.
LAYER_TABLE = """
base:         vacsr vacsr.errors vacsr.atomic vacsr.redact vacsr.seed vacsr.stop vacsr.threads
              vacsr.results vacsr.task_names vacsr.help_format vacsr.compute_device vacsr.paths
              vacsr.folder_lock vacsr.plots
config:       vacsr.config.*
data:         vacsr.data.*
model:        vacsr.model.*
methods:      vacsr.methods.*
eval:         vacsr.eval.*
tasks:        vacsr.tasks
train:        vacsr.train.*
records:      vacsr.records.*
distributed:  vacsr.distributed.*
sweep.spec:   vacsr.sweep vacsr.sweep.spec.*
sweep.plan:   vacsr.sweep.plan.*
sweep.cost:   vacsr.sweep.cost.*
sweep.rehearsal: vacsr.sweep.rehearsal.*
sweep.search: vacsr.sweep.search.*
sweep.final:  vacsr.sweep.final.*
sweep.report: vacsr.sweep.report.*
sweep.flow:   vacsr.sweep.flow.*
sweep.cli:    vacsr.sweep.cli
cli:          vacsr.demo vacsr.cli
"""


def parse_layers(table: str) -> list[tuple[str, list[str]]]:
    """[(layer, its entries)] from a table whose continuation lines start with white space."""
    layers: list[tuple[str, list[str]]] = []
    for line in table.strip().splitlines():
        if line[:1].isspace():
            layers[-1][1].extend(line.split())
        else:
            name, entries = line.split(":", 1)
            layers.append((name, entries.split()))
    return layers


LAYERS = parse_layers(LAYER_TABLE)


def _matches(module: str, entry: str) -> bool:
    if entry.endswith(".*"):
        return module == entry[:-2] or module.startswith(entry[:-1])
    return module == entry


def entries_of(module: str, layers=LAYERS) -> list[tuple[int, str]]:
    """(layer index, entry) of every entry that matches the module."""
    return [(index, entry) for index, (_, entries) in enumerate(layers) for entry in entries
            if _matches(module, entry)]


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index of the module's layer; None when no entry names it (or two do: a table
    test refuses that)."""
    found = entries_of(module, layers)
    return found[0][0] if len(found) == 1 else None


def _imported_module(target: str, modules) -> str | None:
    """The vacsr module an import names (`from m import name` yields m.name: that is m)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def upward_imports(sources: dict[str, tuple[str, str, bool]], layers=LAYERS) -> list[str]:
    """Each import from a lower layer into a higher one, as
    'file:line: importer (its layer) -> imported (its layer)'. sources: module -> (where shown,
    source text, is a package)."""
    found = []
    for module, (where, source, is_package) in sorted(sources.items()):
        own = layer_of(module, layers)
        for line, target in imports_in(source, module, is_package):
            imported = _imported_module(target, sources) if target.startswith("vacsr") else None
            if imported is None or own is None:
                continue
            theirs = layer_of(imported, layers)
            if theirs is not None and theirs > own:
                found.append(f"{where}:{line}: {module} ({layers[own][0]}) -> {imported} "
                             f"({layers[theirs][0]})")
    return sorted(set(found))


def _package_sources() -> dict[str, tuple[str, str, bool]]:
    return {name: (str(path.relative_to(PACKAGE.parent)), path.read_text(),
                   path.name == "__init__.py") for name, path in vacsr_modules().items()}


def test_the_checker_flags_an_import_from_a_higher_layer():
    layers = [("low", ["vacsr.low.*"]), ("high", ["vacsr.high", "vacsr.high.*"])]
    sources = {"vacsr.low.a": ("low/a.py", "import os\n"
                                           "def f():\n"
                                           "    from vacsr.high.b import thing\n", False),
               "vacsr.high.b": ("high/b.py", "from vacsr.low.a import f\n", False)}
    assert upward_imports(sources, layers) == [
        "low/a.py:3: vacsr.low.a (low) -> vacsr.high.b (high)"]
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import vacsr.high.b\n"
    sources["vacsr.low.a"] = ("low/a.py", typing_only, False)
    assert upward_imports(sources, layers) == [
        "low/a.py:3: vacsr.low.a (low) -> vacsr.high.b (high)"]


def test_the_table_reads_as_layers_in_order():
    assert LAYERS[0][0] == "base" and "vacsr.plots" in LAYERS[0][1]
    assert [name for name, _ in LAYERS][-3:] == ["sweep.flow", "sweep.cli", "cli"]
    assert "encoding" not in dict(LAYERS)  # the encoding and its cache are the model's


def test_each_module_matches_exactly_one_entry():
    """No module is claimed by two entries (no entry overrides another); a table that claims
    one twice is caught."""
    claimed = {m: entries_of(m) for m in vacsr_modules()}
    assert {m: e for m, e in claimed.items() if len(e) != 1} == {}
    overlapping = [("data", ["vacsr.data.*"]), ("encoding", ["vacsr.data.encoding"])]
    assert entries_of("vacsr.data.encoding", overlapping) == [(0, "vacsr.data.*"),
                                                              (1, "vacsr.data.encoding")]
    assert layer_of("vacsr.data.encoding", overlapping) is None
    assert layer_of("vacsr.model.encoding") == layer_of("vacsr.model.prefix_cache") \
        == layer_of("vacsr.model.backbone") < layer_of("vacsr.eval.evaluate")
    assert layer_of("vacsr.data.base") < layer_of("vacsr.model.backbone")
    assert layer_of("vacsr.config") == layer_of("vacsr.config.anything")


def test_every_vacsr_module_has_a_layer_and_a_new_one_has_none():
    modules = vacsr_modules()
    assert len(modules) > 100 and "vacsr.sweep.flow.driver" in modules
    assert [m for m in modules if layer_of(m) is None] == []
    assert layer_of("vacsr.new_module") is None and layer_of("vacsr.sweep.new.module") is None


def test_every_entry_names_a_module():
    modules = vacsr_modules()
    stale = [e for _, entries in LAYERS for e in entries
             if not any(_matches(m, e) for m in modules)]
    assert stale == []


def test_no_module_imports_from_a_higher_layer():
    found = upward_imports(_package_sources())
    assert found == [], "\n".join(found)
