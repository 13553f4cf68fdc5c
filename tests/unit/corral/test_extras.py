"""`pip install corral` brings no dataframe or plotting library (issue 24).

The SDK, the CLI's help and the worker entry points are imported in a fresh
interpreter in which polars, pyarrow and matplotlib cannot be imported, as on
a machine that installed corral without its extras; what needs them fails in
one line naming the extra.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

from tests.blocked_imports import run_without

REPO = Path(__file__).resolve().parents[3]
OPTIONAL = ("polars", "pyarrow", "matplotlib")


def _run_without_extras(body: str) -> subprocess.CompletedProcess[str]:
    return run_without(OPTIONAL, body)


def test_the_base_dependencies_name_no_dataframe_or_plotting_library() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {_name(dep) for dep in project["dependencies"]}
    assert names.isdisjoint(OPTIONAL)
    extras = project["optional-dependencies"]
    assert {_name(dep) for dep in extras["export"]} >= {"polars", "pyarrow"}
    assert {_name(dep) for dep in extras["report"]} >= set(OPTIONAL)


def _name(requirement: str) -> str:
    for stop in "<>=!~[; ":
        requirement = requirement.split(stop)[0]
    return requirement.strip().lower()


def test_sdk_cli_help_and_worker_entry_points_import_without_the_extras() -> None:
    body = """
import importlib
for module in ("corral", "corral.sdk", "corral.env", "corral.export", "workers.workflow_worker",
               "workers.node_worker", "workers.intake", "workers.sensor"):
    importlib.import_module(module)
from corral.sdk import Corral
from corral import cli
cli._register()
for args in [["--help"], *([name, "--help"] for name in sorted(cli.cli.commands))]:
    try:
        cli.cli.main(args, prog_name="corral", standalone_mode=False)
    except SystemExit as done:
        assert not done.code, (args, done.code)
print("imported", Corral.__name__)
"""
    done = _run_without_extras(body)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported Corral" in done.stdout


def test_records_writer_names_the_extra_in_one_line() -> None:
    body = """
import tempfile
from pathlib import Path
from observability.extras import MissingExtra
from observability.records import RecordWriter
try:
    RecordWriter(Path(tempfile.mkdtemp()))
except MissingExtra as err:
    print("error:", err)
"""
    done = _run_without_extras(body)
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip()
    assert "\\n" not in line
    assert line.startswith("error: Parquet records needs polars")
    assert "pip install 'corral[export]'" in line


def test_corral_report_names_the_extra_in_one_line() -> None:
    body = """
from corral.cli import main
sys.argv = ["corral", "report", "--out", "/nonexistent-corral-report"]
main()
"""
    done = _run_without_extras(body)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "Error: corral report needs polars, which is not installed: pip install 'corral[report]'"
    ]


def test_a_worker_without_the_export_extra_exits_in_one_line() -> None:
    for module in ("workers.node_worker", "workers.workflow_worker"):
        done = _run_without_extras(f"from {module} import main\nmain()\n")
        assert done.returncode == 1, (module, done.stderr[-3000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (module, done.stderr[-3000:])
        assert "Parquet records) needs polars" in lines[0]
        assert lines[0].endswith("pip install 'corral[export]'")
