"""The test tree has no package `__init__.py`s, so pytest imports every test
module by its basename: two files with one name anywhere under tests/ stop the
whole run at collection ("import file mismatch"). Catch it here, naming both."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename (rename one): {clashes}"


REPO = TESTS.parent


def test_the_unit_tests_mirror_the_source_tree() -> None:
    """tests/unit/<path>/ holds the tests of the source package <path>/, so the
    tests of a module are found beside its path (issue 24)."""
    strays = [
        str(folder.relative_to(TESTS))
        for folder in (TESTS / "unit").rglob("*")
        if folder.is_dir()
        and folder.name not in {"__pycache__", "conformance", "data"}
        and "conformance" not in folder.parts
        and not (REPO / folder.relative_to(TESTS / "unit") / "__init__.py").exists()
    ]
    assert not strays, f"unit test folders with no source package of that path: {strays}"
