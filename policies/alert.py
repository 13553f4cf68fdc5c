"""The alert model: one Falco alert, as Falco's JSON output carries it.

Two senders post the same shape to Corral's intake:

* Falco's own ``http_output`` with ``json_output: true``;
* Falcosidekick's ``webhook`` output (its ``FalcoPayload``).

They differ in small ways that this model absorbs: Falcosidekick may leave out
``uuid`` and ``hostname``, either may send ``tags: null``, priorities arrive as
``Critical``, ``critical`` or ``CRITICAL`` (and ``info``), and times carry
nanoseconds. Corral's own sensor produces the same JSON through
:func:`make_alert`, so everything downstream sees one model.

``ANOMALY_SIGNAL`` lives here (not in ``workflows/``) because the intake sends
it and the episode workflow receives it, and both may import ``policies``.
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract.errors import CorralError
from contract.priority import Priority

ANOMALY_SIGNAL = "anomaly"
"""Signal name the intake sends to an episode workflow; its one argument is
``{"alert": Alert.model_dump(mode="json"), "decision": Decision.model_dump(mode="json")}``."""

# Falco's container.id is the first 12 hex characters of the runtime's id.
CONTAINER_ID_RE = re.compile(r"^[0-9a-f]{12}$")

# The output_fields every Corral alert should carry (DESIGN.md, "Alert JSON").
KEPT_FIELDS = ("container.id", "container.full_id", "proc.cmdline", "proc.pid")


class MalformedAlert(CorralError):
    """An alert body was not Falco alert JSON; the message names what was wrong."""


class Alert(BaseModel):
    """One Falco alert (Falco ``json_output`` / Falcosidekick ``FalcoPayload``)."""

    # Unknown top-level keys are ignored: newer Falco versions add fields and
    # an alert must not be dropped for carrying more than we read.
    model_config = ConfigDict(extra="ignore", frozen=True)

    uuid: str | None = None
    output: str
    priority: Priority
    rule: str = Field(min_length=1)
    time: datetime
    output_fields: dict[str, Any]
    source: str = "syscall"
    tags: list[str] = Field(default_factory=list)
    hostname: str = ""

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: object) -> Priority:
        return Priority.parse(value)

    @field_validator("time", mode="after")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # Falco always sends UTC ("...Z"); a naive time is taken as UTC too.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: object) -> object:
        return [] if value is None else value

    @field_validator("hostname", "source", mode="before")
    @classmethod
    def _none_is_empty(cls, value: object) -> object:
        return "" if value is None else value

    @field_validator("uuid", mode="before")
    @classmethod
    def _empty_uuid(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("output_fields", mode="after")
    @classmethod
    def _container_id(cls, value: dict[str, Any]) -> dict[str, Any]:
        cid = value.get("container.id")
        if cid is None:
            raise ValueError("container.id is missing")
        if not isinstance(cid, str) or not CONTAINER_ID_RE.match(cid):
            raise ValueError(f"container.id must be 12 lowercase hex characters, got {cid!r}")
        full = value.get("container.full_id")
        if full is not None and (not isinstance(full, str) or not full.startswith(cid)):
            raise ValueError(f"container.full_id {full!r} does not start with container.id")
        pid = value.get("proc.pid")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
            raise ValueError(f"proc.pid must be an integer, got {pid!r}")
        return value

    @property
    def container_id(self) -> str:
        return str(self.output_fields["container.id"])

    @property
    def container_full_id(self) -> str | None:
        return self.output_fields.get("container.full_id")

    @property
    def cmdline(self) -> str | None:
        return self.output_fields.get("proc.cmdline")

    @property
    def pid(self) -> int | None:
        return self.output_fields.get("proc.pid")

    def dedup_key(self) -> str:
        """The uuid, or rule+container+time when the sender left the uuid out."""
        if self.uuid:
            return self.uuid
        return f"{self.rule}|{self.container_id}|{self.time.isoformat()}"

    def to_json(self) -> bytes:
        """The body to POST to the intake (Falco's JSON shape)."""
        return self.model_dump_json().encode()


def parse_alert(body: bytes | str) -> Alert:
    """Parse one alert body; raise :class:`MalformedAlert` naming what was wrong."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedAlert(f"alert body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedAlert(f"alert body must be a JSON object, got {type(data).__name__}")
    try:
        return Alert.model_validate(data)
    except ValidationError as exc:
        raise MalformedAlert(_first_error(exc)) from None


def _first_error(exc: ValidationError) -> str:
    """One line: the missing fields, else the first failing field and why."""
    errors = exc.errors()
    missing = [".".join(map(str, e["loc"])) for e in errors if e["type"] == "missing"]
    if missing:
        return f"alert is missing {', '.join(missing)}"
    err = errors[0]
    where = ".".join(str(p) for p in err["loc"]) or "alert"
    msg = str(err["msg"]).removeprefix("Value error, ")
    more = len(errors) - 1
    suffix = f" (and {more} more)" if more else ""
    return f"alert field {where}: {msg}{suffix}"


def make_alert(
    *,
    rule: str,
    priority: Priority | str,
    output: str,
    output_fields: Mapping[str, Any],
    tags: Sequence[str] = (),
    source: str = "syscall",
    hostname: str = "",
    time: datetime | None = None,
    uuid: str | None = None,
) -> Alert:
    """Build an alert the way Falco would, for Corral's own sensor.

    A fresh uuid is generated so the intake's dedup works the same for the
    sensor as for Falco. Raises :class:`MalformedAlert` on bad fields, e.g. a
    container id that is not 12 hex characters.
    """
    data = {
        "uuid": uuid or str(uuidlib.uuid4()),
        "output": output,
        "priority": priority,
        "rule": rule,
        "time": time or datetime.now(UTC),
        "output_fields": dict(output_fields),
        "source": source,
        "tags": list(tags),
        "hostname": hostname,
    }
    try:
        return Alert.model_validate(data)
    except ValidationError as exc:
        raise MalformedAlert(_first_error(exc)) from None
