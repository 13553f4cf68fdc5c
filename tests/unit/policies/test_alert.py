from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from alert_bodies import CID, FULL, encode, falco_body, sidekick_body

from contract.errors import CorralError
from contract.priority import Priority
from policies.alert import (
    ANOMALY_SIGNAL,
    Alert,
    MalformedAlert,
    make_alert,
    parse_alert,
)


def test_falco_http_output_body() -> None:
    alert = parse_alert(encode(falco_body()))
    assert alert.uuid == "8c4b5d8e-0f6a-4e8b-9b7e-5f2b6c1d2e3f"
    assert alert.priority is Priority.ERROR
    assert alert.time == datetime(2025, 1, 2, 12, 0, 0, 123456, tzinfo=UTC)
    assert alert.container_id == CID
    assert alert.container_full_id == FULL
    assert alert.cmdline == "sh -c echo x > /bin/sh"
    assert alert.pid == 4242
    assert alert.output_fields["fd.name"] == "/bin/sh"  # other fields are kept
    assert alert.hostname == "node-1"
    assert "corral_tamper" in alert.tags


def test_sidekick_webhook_body() -> None:
    alert = parse_alert(encode(sidekick_body()))
    assert alert.uuid is None
    assert alert.priority is Priority.CRITICAL
    assert alert.tags == []
    assert alert.hostname == ""
    assert alert.dedup_key() == f"Crypto miner in sandbox|{CID}|2025-01-02T12:00:00.123456+00:00"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CRITICAL", Priority.CRITICAL),
        ("informational", Priority.INFORMATIONAL),
        ("info", Priority.INFORMATIONAL),
        ("Warning", Priority.WARNING),
        (" debug ", Priority.DEBUG),
    ],
)
def test_priority_spellings(text: str, expected: Priority) -> None:
    assert parse_alert(encode(falco_body(priority=text))).priority is expected


def test_unknown_top_level_keys_are_ignored() -> None:
    assert parse_alert(encode(falco_body(extra_field=1))).rule


def test_roundtrip_and_json_shape() -> None:
    alert = parse_alert(encode(falco_body()))
    dumped = json.loads(alert.to_json())
    assert dumped["priority"] == "Error"
    assert dumped["time"].endswith("Z")
    assert set(dumped) == {
        "uuid", "output", "priority", "rule", "time", "output_fields", "source", "tags", "hostname"
    }  # fmt: skip
    assert parse_alert(alert.to_json()) == alert


def test_naive_time_is_utc() -> None:
    alert = parse_alert(encode(falco_body(time="2025-01-02T12:00:00")))
    assert alert.time.tzinfo is UTC


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "alert body is not JSON"),
        (b"\xff\xfe", "alert body is not JSON"),
        (b"[1, 2]", "alert body must be a JSON object, got list"),
        (b"{}", "alert is missing output, priority, rule, time, output_fields"),
        (encode(falco_body(priority="Loud")), "alert field priority: unknown priority 'Loud'"),
        (encode(falco_body(time="yesterday")), "alert field time:"),
        (encode(falco_body(output_fields={})), "container.id is missing"),
        (
            encode(falco_body(output_fields={"container.id": "host"})),
            "container.id must be 12 lowercase hex characters, got 'host'",
        ),
        (
            encode(falco_body(output_fields={"container.id": CID, "container.full_id": "ff" * 32})),
            "does not start with container.id",
        ),
        (
            encode(falco_body(output_fields={"container.id": CID, "proc.pid": "12"})),
            "proc.pid must be an integer",
        ),
        (encode(falco_body(rule="")), "alert field rule:"),
        (encode(falco_body(tags="corral")), "alert field tags:"),
    ],
)
def test_malformed(body: bytes, message: str) -> None:
    with pytest.raises(MalformedAlert) as info:
        parse_alert(body)
    text = str(info.value)
    assert message in text
    assert "\n" not in text
    assert isinstance(info.value, CorralError)


def test_priority_order() -> None:
    order = [
        Priority.EMERGENCY, Priority.ALERT, Priority.CRITICAL, Priority.ERROR,
        Priority.WARNING, Priority.NOTICE, Priority.INFORMATIONAL, Priority.DEBUG,
    ]  # fmt: skip
    assert sorted(order, reverse=True) == order
    assert Priority.CRITICAL > Priority.WARNING
    assert Priority.ERROR >= Priority.ERROR
    assert Priority.DEBUG < Priority.INFORMATIONAL  # not alphabetical
    assert Priority.ALERT > Priority.CRITICAL
    assert max(Priority.NOTICE, Priority.EMERGENCY) is Priority.EMERGENCY
    assert Priority.EMERGENCY.severity == 7 and Priority.DEBUG.severity == 0


def test_priority_is_its_falco_spelling() -> None:
    assert Priority.CRITICAL == "Critical"
    assert str(Priority.INFORMATIONAL) == "Informational"
    with pytest.raises(ValueError, match="unknown priority"):
        Priority.parse("urgent")


def test_make_alert_matches_falco_shape() -> None:
    alert = make_alert(
        rule="Read sensitive file in sandbox",
        priority="warning",
        output="Sensitive file opened for reading (file=/etc/shadow)",
        output_fields={"container.id": CID, "proc.pid": 7, "proc.cmdline": "cat /etc/shadow"},
        tags=["corral"],
        hostname="node-1",
    )
    assert alert.uuid and len(alert.uuid) == 36
    assert alert.priority is Priority.WARNING
    assert alert.time.tzinfo is UTC
    assert parse_alert(alert.to_json()) == alert
    assert isinstance(alert, Alert)


def test_make_alert_rejects_bad_container() -> None:
    with pytest.raises(MalformedAlert, match=r"container\.id"):
        make_alert(rule="r", priority="Error", output="o", output_fields={"container.id": "x"})


def test_signal_name() -> None:
    assert ANOMALY_SIGNAL == "anomaly"
