"""docs/trajectories.md's snippet, run on the recorded episode histories."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory

REPO = Path(__file__).resolve().parents[3]
HISTORIES = REPO / "tests" / "data" / "histories"


def _snippet() -> dict[str, Any]:
    text = (REPO / "docs" / "trajectories.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), "docs/trajectories.md", "exec"), namespace)
    return namespace


def _history(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(name, (HISTORIES / f"{name}.json").read_text())


def test_trajectory_of_a_scripted_episode() -> None:
    steps = _snippet()["trajectory"](_history("scripted"))
    assert [s["input"]["index"] for s in steps] == [0, 1, 2]
    assert [s["input"]["source"] for s in steps] == ["scripted", "scripted", "reward"]
    assert steps[0]["input"]["step"]["cmd"] == "cat /tmp/a"
    assert steps[0]["result"]["stdout"] == "x"
    assert steps[1]["result"]["stderr"] == "err\n"
    assert steps[2]["result"]["stdout"] == "1\n"


def test_trajectory_of_an_interactive_episode() -> None:
    steps = _snippet()["trajectory"](_history("interactive"))
    assert [(s["input"]["source"], s["result"]["exit_code"]) for s in steps] == [
        ("scripted", 0),
        ("interactive", 0),
        ("reward", 0),
    ]
    assert steps[1]["result"]["stdout"] == "hi\n"


def test_signals_of_quarantine_and_release() -> None:
    signals = _snippet()["signals"](_history("quarantine_release"))
    assert [name for name, _ in signals] == ["anomaly", "release"]
    assert signals[0][1]["decision"]["action"] == "quarantine"
    assert signals[1][1] == {"reason": "false positive", "by": "oncall"}
