"""A bad spec file fails the CLI in one line naming the field, before it
connects to anything (issue 24): the Temporal address here leads nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_corral_cli import assert_one_line_error, run_cli

BAD_SPECS = [
    ("image: busybox\nenv:\n  'A B': x\n", "env key 'A B'"),
    (
        "image: busybox\nnetwork:\n  mode: allowlist\n  egress:\n    - cidr: 10.0.0.1/8\n",
        "network.egress.0.cidr",
    ),
    ("image: busybox\nsteps:\n  - cmd: ls\n    workdir: tmp\n", "steps.0.workdir"),
]


@pytest.mark.parametrize(("text", "field"), BAD_SPECS)
@pytest.mark.parametrize("command", [["episode", "start"], ["run"]])
def test_bad_spec_file_fails_in_one_line_before_connecting(
    tmp_path: Path, command: list[str], text: str, field: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    done = run_cli(*command, "--spec", str(spec), tmp_path=tmp_path)
    assert_one_line_error(done, "invalid episode spec")
    assert_one_line_error(done, field)
    assert "Temporal" not in done.stderr  # it never tried to connect
