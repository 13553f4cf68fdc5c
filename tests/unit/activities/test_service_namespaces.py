"""An episode's service shares its agent sandbox's network and user namespaces
(activities/services.py); every other sandbox gets new ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.services import _append_hosts
from contract.models import EpisodeSpec
from sandbox.models import SandboxSpec
from sandbox.spec import build_oci_spec
from sandbox.userns import IdMapping

MAPPING = IdMapping(host_id=1_000_000_000, size=65536)


def namespaces(**fields: object) -> dict[str, str]:
    spec = SandboxSpec.model_validate({"image": "busybox", **fields})
    oci = build_oci_spec("sb", spec, userns=MAPPING)
    return {ns["type"]: ns.get("path", "") for ns in oci["linux"]["namespaces"]}


def test_a_sandbox_gets_new_namespaces() -> None:
    assert set(namespaces().values()) == {""}


def test_a_service_joins_the_network_and_user_namespaces_of_its_agent() -> None:
    joined = namespaces(join_network_of=4242)
    assert joined["network"] == "/proc/4242/ns/net" and joined["user"] == "/proc/4242/ns/user"
    assert joined["pid"] == joined["mount"] == joined["ipc"] == ""  # its own processes and files


def test_without_a_user_namespace_only_the_network_is_joined() -> None:
    joined = namespaces(join_network_of=4242, user_namespace=False)
    assert joined["network"] == "/proc/4242/ns/net" and "user" not in joined


def test_service_names_are_host_names_and_unique() -> None:
    service = {"name": "db", "image": "busybox", "command": "true"}
    spec = EpisodeSpec.model_validate({"image": "busybox", "services": [service]})
    assert spec.services[0].argv() == ["/bin/sh", "-c", "true"]
    for bad in (
        [service, service],
        [{**service, "name": "localhost"}],
        [{**service, "name": "Db"}],
    ):
        with pytest.raises(ValidationError):
            EpisodeSpec.model_validate({"image": "busybox", "services": bad})


def test_service_names_are_added_to_hosts_once_and_no_symlink_is_followed(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    _append_hosts(tmp_path, "127.0.0.1 db\n")
    _append_hosts(tmp_path, "127.0.0.1 db\n")  # a retried provision
    assert (tmp_path / "etc" / "hosts").read_text() == "127.0.0.1 localhost\n127.0.0.1 db\n"

    outside = tmp_path / "host-file"
    outside.write_text("host\n")
    (tmp_path / "etc" / "hosts").unlink()
    (tmp_path / "etc" / "hosts").symlink_to(outside)
    with pytest.raises(OSError):
        _append_hosts(tmp_path, "127.0.0.1 db\n")
    assert outside.read_text() == "host\n"
