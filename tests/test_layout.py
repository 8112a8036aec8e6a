"""The package's imports keep the layout DESIGN.md describes.

The contracts are in pyproject.toml (``[tool.importlinter]``; ``lint-imports`` checks them too): no import cycle
between flowscope's packages nor between the importers' modules, client/ and service/ independent of each other,
the model at the bottom, analyses over tables only, presenters that only read. The graph is grimp's, built from
the source: an import inside a function counts like any other (a cycle hidden in a function body is still one).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
CONTRACTS = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("flowscope", cache_dir=None)


def _child(parent: str, module: str) -> str | None:
    """The child of ``parent`` that holds ``module`` (None when ``module`` is not under ``parent``)."""
    if not module.startswith(parent + "."):
        return None
    return ".".join(module.split(".")[:parent.count(".") + 2])


def cycles(graph: grimp.ImportGraph, parent: str) -> list[str]:
    """Each group of children of ``parent`` that import each other in a cycle, with one import per edge
    (importer, line, imported)."""
    edges: dict[tuple[str, str], str] = {}
    for importer in sorted(graph.find_descendants(parent)):
        a = _child(parent, importer)
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            b = _child(parent, imported)
            if b is None or a == b or (a, b) in edges:
                continue
            line = graph.get_import_details(importer=importer, imported=imported)[0]["line_number"]
            edges[(a, b)] = f"{importer}:{line} imports {imported}"
    out = {a: sorted(b for (x, b) in edges if x == a) for a, _ in edges}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in out.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(out):
        if v not in index:
            visit(v)
    return [" <-> ".join(g) + ": " + "; ".join(edges[e] for e in sorted(edges) if e[0] in g and e[1] in g)
            for g in groups]


def test_no_import_cycle_between_packages(graph):
    found = cycles(graph, "flowscope")
    assert not found, "import cycles between flowscope's packages:\n" + "\n".join(found)


def test_no_import_cycle_between_the_importers_modules(graph):
    found = cycles(graph, "flowscope.importers")
    assert not found, "import cycles between the importers' modules:\n" + "\n".join(found)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path, monkeypatch):
    """The check reads imports inside function bodies: two packages whose only back edge is an import in a
    function are a cycle."""
    pkg = tmp_path / "layoutprobe"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "m.py").write_text("from layoutprobe.b.n import helper\n")
    (pkg / "b" / "n.py").write_text("def helper():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles(grimp.build_graph("layoutprobe", cache_dir=None), "layoutprobe") == []
    (pkg / "b" / "n.py").write_text("def helper():\n    from layoutprobe.a import m\n    return m\n")
    assert cycles(grimp.build_graph("layoutprobe", cache_dir=None), "layoutprobe") == [
        ("layoutprobe.a <-> layoutprobe.b: layoutprobe.a.m:1 imports layoutprobe.b.n; "
         "layoutprobe.b.n:2 imports layoutprobe.a.m")]


@pytest.mark.parametrize("contract", [c["id"] for c in CONTRACTS])
def test_import_contract_is_kept(contract, capsys):
    code = lint_imports(config_filename=str(PYPROJECT), limit_to_contracts=(contract,), no_cache=True,
                        no_logo=True)
    assert code == 0, capsys.readouterr().out


def test_the_client_package_reaches_collectors_by_address_and_flowscope_client_embeds_one(tmp_path, monkeypatch):
    """client/ knows no collector: its Client, given no address, says what to use instead and starts nothing;
    flowscope.Client (embedded.py, above client/ and service/) runs a collector in this process."""
    import flowscope
    from flowscope.client.client import Client, FlowscopeError

    for var in ("FLOWSCOPE_ADDRESS", "FLOWSCOPE_ADDRESS_FILE", "FLOWSCOPE_RUN"):
        monkeypatch.delenv(var, raising=False)
    store = tmp_path / "store"
    with pytest.raises(FlowscopeError, match="no collector address.*flowscope.Client"):
        Client(store=store, name="base")
    assert not store.exists()
    with flowscope.Client(store=store, name="embedded") as fs:
        fs.log("written through the embedded collector")
        run_dir = fs.run_dir
    assert isinstance(fs, Client)
    logs = flowscope.open_run(run_dir).sql("SELECT message FROM logs")
    assert logs["message"].tolist() == ["written through the embedded collector"]


def test_flowscope_client_costs_no_pandas_import():
    """Composing the embedded mode above client/ keeps what a recording program imports: flowscope.Client
    (embedded.py) does not import pandas or duckdb (a step, which checks tables, does)."""
    import subprocess
    import sys

    code = "import sys, flowscope\nflowscope.Client\nprint('pandas' in sys.modules, 'duckdb' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def _loaded_libraries(pid: int) -> set[str]:
    """The shared objects mapped into process ``pid`` (its imported extension modules among them)."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if line.rstrip().endswith(".so") or ".so." in line}


def test_a_collector_serves_and_ingests_without_the_analyses_imports(collector):
    """A collector process (`flowscope serve`, started by every observe() and `flowscope run`) imports what it
    serves and stores, not the analyses behind the dashboard's pages: pandas (the analyses' frames) is not in it
    after a run was opened, sent a batch and closed, until a page asks for a view. Checked on the real process, by
    the extension modules mapped into it."""
    import flowscope

    with flowscope.Client(collector.address, name="imports") as fs:
        fs.span("one", start_ns=1, end_ns=2)
    libraries = _loaded_libraries(collector.pid)
    assert any("pyarrow" in lib for lib in libraries)  # it did store the batch: Arrow is in it
    assert not [lib for lib in libraries if "/pandas/" in lib]


def test_the_commands_parser_imports_no_analysis():
    """`flowscope COMMAND --help` (and every command's start, the collector's included) builds the parser of every
    command; that costs neither pandas nor the analyses' modules."""
    import subprocess
    import sys

    code = ("import sys\nfrom flowscope.cli.main import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in sys.modules if m == 'pandas' or m.startswith(('flowscope.analysis', "
            "'flowscope.report'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_forecast_routes_read_the_models_variable_the_forecast_writes():
    """The collector's forecast routes name $FLOWSCOPE_FORECAST_MODEL themselves (so that starting one imports no
    forecast): the same variable `flowscope serve --forecast-model` sets and the forecast reads."""
    from flowscope.analysis.forecast import model
    from flowscope.service import forecast_routes

    assert forecast_routes.MODELS_ENV == model.MODELS_ENV
