"""The step journal (activities/step_exec.py: StepJournal): a sandbox's steps as
lines appended to one file, a start before each step and its result after, and
what a crash leaves."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from activities.step_exec import StepJournal, StepJournals
from contract.models import StepResult

AT = datetime(2026, 12, 7, 15, 0, tzinfo=UTC)


def _result(index: int = 3) -> StepResult:
    return StepResult(index=index, cmd="echo hi", exit_code=0, stdout="hi\nthere\n")


def test_a_step_is_not_started_then_started_then_done(tmp_path: Path) -> None:
    journal = StepJournal(tmp_path / "sandbox")
    assert journal.read(3) == (None, None)
    journal.start(3, AT)
    assert StepJournal(tmp_path / "sandbox").read(3) == (AT, None)  # a worker after a crash
    journal.end(3, _result())
    journal.start(4, AT)
    assert journal.read(3) == (AT, _result())
    again = StepJournal(tmp_path / "sandbox")
    assert (again.read(3), again.read(4)) == ((AT, _result()), (AT, None))
    assert [p.name for p in (tmp_path / "sandbox").iterdir()] == [StepJournal.NAME]


def test_a_line_cut_off_mid_append_is_no_line_and_the_next_replaces_it(tmp_path: Path) -> None:
    journal = StepJournal(tmp_path)
    journal.start(3, AT)
    line = b"R 3 " + _result().model_dump_json().encode()
    with journal.path.open("ab") as log:
        log.write(line[: len(line) // 2])  # the worker died mid-write
    again = StepJournal(tmp_path)
    assert again.read(3) == (AT, None)  # taken as cut off: reattached, never rerun
    again.end(3, _result())
    again.start(4, AT)
    after = StepJournal(tmp_path)
    assert (after.read(3), after.read(4)) == ((AT, _result()), (AT, None))


def test_the_older_layout_and_hand_made_markers_are_read(tmp_path: Path) -> None:
    (tmp_path / "1.started").write_text(AT.isoformat())
    (tmp_path / "1.json").write_text(_result(1).model_dump_json())
    (tmp_path / "2.started").write_text("x")  # a marker with no time: started, now
    journal = StepJournal(tmp_path)
    assert journal.read(1) == (AT, _result(1))
    started_at, done = journal.read(2)
    assert started_at is not None and done is None
    journal.end(2, _result(2))
    assert StepJournal(tmp_path).read(2)[1] == _result(2)


def test_journals_in_use_are_kept_a_bounded_few(tmp_path: Path) -> None:
    journals = StepJournals()
    journals.KEEP = 2
    first = journals.of(tmp_path / "a")
    assert journals.of(tmp_path / "a") is first
    journals.of(tmp_path / "b")
    journals.of(tmp_path / "c")
    assert journals.of(tmp_path / "a") is not first  # dropped, read again
