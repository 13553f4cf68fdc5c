"""The distribution-protocol client's logic: references, challenges, the bearer flow.

The bearer flow runs against a small aiohttp token server and registry endpoint
on loopback made here (Debian's docker-registry cannot issue tokens itself);
basic auth and everything else is tested against the real docker-registry in
tests/integration/registry.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from contract.config import load_config
from contract.ids import LOCAL_REGISTRY
from sandbox.registry import (
    Credentials,
    ImagePullFailed,
    InvalidReference,
    Reference,
    RegistryOptions,
    RegistrySession,
    digest_of,
    is_registry_reference,
    parse_challenge,
    registry_error_message,
    registry_options,
)
from sandbox.transfer import host_platform, select_platform

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost:5000/a/b:v1", Reference("localhost:5000", "a/b", "v1")),
        ("registry.lan/team/img", Reference("registry.lan", "team/img", "latest")),
        ("docker.io/busybox:1.36", Reference("docker.io", "library/busybox", "1.36")),
        (
            "127.0.0.1:5000/x@sha256:" + "a" * 64,
            Reference("127.0.0.1:5000", "x", "latest", "sha256:" + "a" * 64),
        ),
    ],
)
def test_reference_parses(text: str, expected: Reference) -> None:
    assert Reference.parse(text) == expected


def test_reference_name_and_api_host() -> None:
    by_digest = Reference.parse("localhost:5000/x:v1@sha256:" + "b" * 64)
    assert by_digest.reference == "sha256:" + "b" * 64
    assert by_digest.name == "localhost:5000/x@sha256:" + "b" * 64
    assert Reference.parse("docker.io/busybox").api_host == "registry-1.docker.io"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("busybox:latest", "not a registry reference"),
        ("localhost:5000/Upper:v1", "invalid repository 'Upper'"),
        ("localhost:5000/a:-bad", "invalid tag '-bad'"),
        ("localhost:5000/a@sha256:12", "invalid digest"),
    ],
)
def test_bad_references_name_what_is_wrong(text: str, complaint: str) -> None:
    with pytest.raises(InvalidReference, match=complaint) as caught:
        Reference.parse(text)
    assert "\n" not in str(caught.value)


def test_which_names_a_registry_serves() -> None:
    assert is_registry_reference("localhost:5000/a:v1", LOCAL_REGISTRY)
    assert is_registry_reference("ghcr.io/org/img:v1", LOCAL_REGISTRY)
    assert not is_registry_reference(f"{LOCAL_REGISTRY}/busybox:latest", LOCAL_REGISTRY)


def test_plain_http_only_for_the_insecure_hosts() -> None:
    options = RegistryOptions()
    assert options.scheme("localhost:5000") == "http"
    assert options.scheme("127.0.0.1") == "http"
    assert options.scheme("[::1]:5000") == "http"
    assert options.scheme("registry.example:5000") == "https"
    assert RegistryOptions(insecure=("reg.lan:5000",)).scheme("reg.lan:5000") == "http"


def test_challenges_parse_quoted_and_bare_params() -> None:
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.example/token",service="reg",scope="repository:a:pull"'
    )
    assert scheme == "bearer"
    assert params == {
        "realm": "https://auth.example/token",
        "service": "reg",
        "scope": "repository:a:pull",
    }
    assert parse_challenge("Basic realm=corral") == ("basic", {"realm": "corral"})


def test_registry_errors_become_one_line() -> None:
    body = json.dumps({"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest\nunknown"}]})
    assert (
        registry_error_message(404, body.encode()) == "HTTP 404 MANIFEST_UNKNOWN: manifest unknown"
    )
    assert registry_error_message(502, b"<html>bad gateway</html>") == (
        "HTTP 502 <html>bad gateway</html>"
    )


def test_select_platform_skips_other_platforms() -> None:
    os_name, arch = host_platform()
    other = {"digest": "sha256:o", "platform": {"os": os_name, "architecture": "s390x"}}
    mine = {"digest": "sha256:m", "platform": {"os": os_name, "architecture": arch}}
    assert select_platform({"manifests": [other, mine]}) == mine
    assert select_platform({"manifests": [other]}) is None


def test_config_reads_insecure_hosts_and_credentials_from_the_environment() -> None:
    env = {"CORRAL_REGISTRY_INSECURE": "reg.lan:5000, other", "CORRAL_REGISTRY": "reg.lan:5000"}
    config = load_config(REPO / "temporal-dev.yaml", env=env)
    options = registry_options(
        config.registry, {"CORRAL_REGISTRY_USERNAME": "u", "CORRAL_REGISTRY_PASSWORD": "p"}
    )
    assert config.registry.default == "reg.lan:5000"
    assert options.insecure == ("reg.lan:5000", "other")
    assert options.credentials == Credentials("u", "p")
    assert registry_options(config.registry, {}).credentials is None


# -- bearer tokens ------------------------------------------------------------------------
MANIFEST = json.dumps(
    {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {},
        "layers": [],
    }
).encode()


class TokenRegistry:
    """A registry endpoint that wants bearer tokens, and the token server issuing them."""

    def __init__(self) -> None:
        self.scopes: list[str] = []
        self.valid: set[str] = set()  # tokens issued and not yet expired
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/", self.ping)
        app.router.add_get("/token", self.token)
        app.router.add_get("/v2/{repo:.+}/manifests/{ref}", self.manifest)
        return app

    def _challenge(self) -> web.Response:
        realm = f"http://127.0.0.1:{self.port}/token"
        header = f'Bearer realm="{realm}",service="corral-test"'
        return web.Response(status=401, headers={"WWW-Authenticate": header})

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization", "") in self.valid

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="{}") if self._authorized(request) else self._challenge()

    async def token(self, request: web.Request) -> web.Response:
        want = "Basic " + base64.b64encode(b"trainer:secret").decode()
        if request.headers.get("Authorization") != want:
            return web.Response(status=401)
        assert request.query["service"] == "corral-test"
        self.scopes.append(request.query["scope"])
        token = f"t-{len(self.scopes)}"
        self.valid.add(f"Bearer {token}")
        return web.json_response({"token": token})

    async def manifest(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._challenge()
        return web.Response(
            body=MANIFEST, content_type="application/vnd.oci.image.manifest.v1+json"
        )


@pytest_asyncio.fixture
async def token_registry() -> AsyncIterator[TokenRegistry]:
    server = TokenRegistry()
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server
    finally:
        await runner.cleanup()


async def test_bearer_token_is_fetched_for_the_repository_scope(
    token_registry: TokenRegistry,
) -> None:
    ref = Reference.parse(f"127.0.0.1:{token_registry.port}/team/img:v1")
    async with RegistrySession(ref, RegistryOptions(), Credentials("trainer", "secret")) as reg:
        body, media_type = await reg.get_manifest("v1")
    assert body == MANIFEST and media_type.endswith("manifest.v1+json")
    assert token_registry.scopes == ["repository:team/img:pull"]

    async with RegistrySession(ref, RegistryOptions(), Credentials("trainer", "secret"), push=True):
        pass
    assert token_registry.scopes[-1] == "repository:team/img:pull,push"


async def test_bearer_token_refused_fails_in_one_line(token_registry: TokenRegistry) -> None:
    ref = Reference.parse(f"127.0.0.1:{token_registry.port}/team/img:v1")
    with pytest.raises(ImagePullFailed, match="refused the credentials") as caught:
        async with RegistrySession(ref, RegistryOptions(), Credentials("trainer", "nope")):
            pass
    assert ref.name in str(caught.value) and "\n" not in str(caught.value)


async def test_manifest_by_digest_is_verified(token_registry: TokenRegistry) -> None:
    ref = Reference.parse(f"127.0.0.1:{token_registry.port}/team/img:v1")
    async with RegistrySession(ref, RegistryOptions(), Credentials("trainer", "secret")) as reg:
        body, _ = await reg.get_manifest(digest_of(MANIFEST))
        assert body == MANIFEST
        with pytest.raises(ImagePullFailed, match="digest mismatch"):
            await reg.get_manifest("sha256:" + "0" * 64)


async def test_expired_token_is_renewed_once(token_registry: TokenRegistry) -> None:
    ref = Reference.parse(f"127.0.0.1:{token_registry.port}/team/img:v1")
    async with RegistrySession(ref, RegistryOptions(), Credentials("trainer", "secret")) as reg:
        token_registry.valid.clear()  # the token server's tokens expire
        body, _ = await reg.get_manifest("v1")
    assert body == MANIFEST
    assert len(token_registry.scopes) == 2
