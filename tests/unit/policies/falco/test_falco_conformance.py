"""Every conformance case reaches Falco's verdict (see conformance_cases.py)."""

from __future__ import annotations

import pytest
from conformance_cases import Case, agrees, load_cases, verdict

CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_falco_verdict(case: Case) -> None:
    if case.divergence:
        assert not agrees(case), f"{case.id} now agrees with Falco: drop its divergence note"
        return
    assert agrees(case), f"Falco: {case.expect}; here: {verdict(case)}"


def test_cases_cover_loader_and_filter_tests() -> None:
    files = {c.file for c in CASES}
    assert {"loader", "filter_parser", "filter_compiler"} <= files
    assert len({c.id for c in CASES}) == len(CASES), "case names must be unique per file"
