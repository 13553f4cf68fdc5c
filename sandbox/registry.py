"""The OCI distribution protocol (Docker Registry HTTP API v2), client side.

What Corral needs of it: references (``host[:port]/repo[:tag][@digest]``),
authentication (anonymous, HTTP basic, and bearer tokens fetched from the
realm a ``WWW-Authenticate`` challenge names), manifests by tag or digest,
blobs streamed with their digests checked, and uploads (monolithic
``POST`` + ``PUT``). Containerd's stores are not touched here; see
``sandbox.transfer`` for pulling into and pushing from them.

Authentication happens once per session, before the first real request: a
``GET /v2/`` tells which scheme the registry wants, and a bearer token is
asked for the session's repository scope. Request bodies (uploads) are
therefore never replayed after a 401.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
from yarl import URL

from contract.config import DEFAULT_INSECURE, RegistryConfig
from contract.errors import InvalidSpec, SandboxError
from sandbox.grpc_errors import one_line

MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (MEDIA_OCI_MANIFEST, MEDIA_OCI_INDEX, MEDIA_DOCKER_MANIFEST, MEDIA_DOCKER_LIST)
INDEX_MEDIA_TYPES = frozenset({MEDIA_OCI_INDEX, MEDIA_DOCKER_LIST})
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
MANIFEST_MAX_BYTES = 4 * 1024 * 1024
CHUNK = 1024 * 1024
CONNECT_ATTEMPTS = 3  # a registry that is down fails the pull after these, never forever
RETRY_DELAY_S = 0.5

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}$")
_CHALLENGE_PARAM = re.compile(r'(\w+)=(?:"([^"]*)"|([^,\s]*))')

Progress = Callable[[str, int, int], None]  # (digest, bytes done, bytes total)


class RegistryError(SandboxError):
    """Talking to an image registry failed; the message names the reference."""

    verb = "reach"


class ImagePullFailed(RegistryError):
    """An image could not be pulled (unknown, unauthorized, corrupt, registry down).

    Nothing of the pull is left behind in containerd.
    """

    verb = "pull"


class ImagePushFailed(RegistryError):
    """An image could not be pushed to a registry."""

    verb = "push"


class InvalidReference(InvalidSpec):
    """The text is not a registry reference."""


@dataclass(frozen=True)
class Reference:
    """``host/repository`` plus a tag or a digest (or both: the digest wins)."""

    host: str
    repository: str
    tag: str = "latest"
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        host, sep, rest = text.partition("/")
        if not sep or not _looks_like_host(host):
            raise InvalidReference(
                f"{text!r} is not a registry reference (want HOST[:PORT]/REPO[:TAG])"
            )
        rest, _, digest = rest.partition("@")
        repository, tag = rest, "latest"
        last = rest.rsplit("/", 1)[-1]
        if ":" in last:
            repository, tag = rest.rsplit(":", 1)
        if host == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        for part, pattern, what in ((repository, _REPO_RE, "repository"), (tag, _TAG_RE, "tag")):
            if not pattern.match(part):
                raise InvalidReference(f"{text!r}: invalid {what} {part!r}")
        if digest and not _DIGEST_RE.match(digest):
            raise InvalidReference(f"{text!r}: invalid digest {digest!r} (want sha256:<64 hex>)")
        return cls(host, repository, tag, digest or None)

    @property
    def name(self) -> str:
        """The image name containerd stores it under."""
        suffix = f"@{self.digest}" if self.digest else f":{self.tag}"
        return f"{self.host}/{self.repository}{suffix}"

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/``."""
        return self.digest or self.tag

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.host == DOCKER_HUB else self.host


def _looks_like_host(part: str) -> bool:
    return "." in part or ":" in part or part == "localhost"


def is_registry_reference(name: str, local_registry: str) -> bool:
    """Whether ``name`` (already resolved) names an image some registry serves."""
    host = name.split("/", 1)[0]
    return "/" in name and host != local_registry and _looks_like_host(host)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


@dataclass(frozen=True)
class RegistryOptions:
    """How to reach registries: plain-HTTP hosts and default credentials."""

    insecure: tuple[str, ...] = DEFAULT_INSECURE
    credentials: Credentials | None = None

    def scheme(self, host: str) -> str:
        """http for the insecure hosts (with or without a port), https for the rest."""
        bare = host if host.startswith("[") else host.split(":", 1)[0]
        if host.startswith("[") and "]:" in host:
            bare = host.split("]:", 1)[0] + "]"
        return "http" if host in self.insecure or bare in self.insecure else "https"


def credentials_from(username: str | None, password: str | None) -> Credentials | None:
    return Credentials(username, password or "") if username else None


def registry_options(
    config: RegistryConfig, env: Mapping[str, str] | None = None
) -> RegistryOptions:
    """The stack config's registries as options: hosts, and credentials from the
    environment only (secrets stay out of the file)."""
    source = os.environ if env is None else env
    credentials = credentials_from(source.get(config.username_env), source.get(config.password_env))
    return RegistryOptions(insecure=tuple(config.insecure), credentials=credentials)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="https://auth",service="reg",scope="x"`` -> ("bearer", {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {key.lower(): quoted or bare for key, quoted, bare in _CHALLENGE_PARAM.findall(rest)}
    return scheme.lower(), params


def registry_error_message(status: int, body: bytes) -> str:
    """The registry's own error codes (``{"errors": [{"code", "message"}]}``) in one line."""
    try:
        errors = json.loads(body).get("errors") or []
        text = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors)
    except (ValueError, AttributeError):
        text = body.decode(errors="replace")
    return one_line(f"HTTP {status}" + (f" {text}" if text.strip() else ""), 300)


class RegistrySession:
    """One authenticated HTTP session against one repository of one registry."""

    def __init__(
        self,
        ref: Reference,
        options: RegistryOptions,
        credentials: Credentials | None = None,
        *,
        push: bool = False,
        error: type[RegistryError] = ImagePullFailed,
    ) -> None:
        self.ref = ref
        self._credentials = credentials or options.credentials
        self._push = push
        self._error = error
        self._root = URL(f"{options.scheme(ref.api_host)}://{ref.api_host}/v2/")
        self._repo_url = self._root / ref.repository
        self._auth: dict[str, str] = {}
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RegistrySession:
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=120)
        self._http = aiohttp.ClientSession(timeout=timeout)
        try:
            await self._authenticate()
        except BaseException:
            await self._http.close()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._http is not None:
            await self._http.close()

    def fail(self, what: str) -> RegistryError:
        return self._error(f"{self._error.verb} {self.ref.name}: {what}")

    # -- auth ------------------------------------------------------------------------
    async def _authenticate(self) -> None:
        async with await self._request("GET", self._root, reauth=False) as resp:
            if resp.status != 401:
                return
            challenge = resp.headers.get("WWW-Authenticate", "")
        await self._authorize(challenge)
        async with await self._request("GET", self._root, reauth=False) as resp:
            if resp.status == 401:
                raise self.fail("unauthorized: wrong username or password")

    async def _authorize(self, challenge: str) -> None:
        """Answer a ``WWW-Authenticate`` challenge: basic credentials or a fresh token."""
        scheme, params = parse_challenge(challenge)
        if scheme == "basic":
            if self._credentials is None:
                raise self.fail("the registry wants a username and password (none given)")
            self._auth = {"Authorization": self._credentials.basic()}
        elif scheme == "bearer" and params.get("realm"):
            self._auth = {"Authorization": f"Bearer {await self._fetch_token(params)}"}
        else:
            raise self.fail(f"unsupported authentication challenge {challenge!r}")

    async def _fetch_token(self, params: dict[str, str]) -> str:
        actions = "pull,push" if self._push else "pull"
        query = {"scope": f"repository:{self.ref.repository}:{actions}"}
        if params.get("service"):
            query["service"] = params["service"]
        headers = {"Authorization": self._credentials.basic()} if self._credentials else {}
        async with await self._request(
            "GET", URL(params["realm"]).update_query(query), headers=headers, authorized=False
        ) as resp:
            body = await resp.read()
            if resp.status in (401, 403):
                raise self.fail("unauthorized: the token server refused the credentials")
            if resp.status != 200:
                raise self.fail(f"token server: {registry_error_message(resp.status, body)}")
        try:
            answer = json.loads(body)
            return str(answer.get("token") or answer["access_token"])
        except (ValueError, KeyError, AttributeError) as err:
            raise self.fail("token server answered without a token") from err

    # -- requests --------------------------------------------------------------------
    async def _request(
        self,
        method: str,
        url: URL,
        *,
        headers: Mapping[str, str] | None = None,
        data: Any = None,
        authorized: bool = True,
        reauth: bool = True,
    ) -> aiohttp.ClientResponse:
        """One request. A 401 on a request without a body (an expired token, a
        repository that wants more than the registry's root did) is answered once."""
        resp = await self._send(method, url, headers, data, authorized)
        if resp.status != 401 or data is not None or not (authorized and reauth):
            return resp
        challenge = resp.headers.get("WWW-Authenticate", "")
        resp.release()
        await self._authorize(challenge)
        return await self._send(method, url, headers, data, authorized)

    async def _send(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str] | None,
        data: Any,
        authorized: bool,
    ) -> aiohttp.ClientResponse:
        """Connection failures are retried a few times, then reported."""
        assert self._http is not None
        all_headers = {**(self._auth if authorized else {}), **(headers or {})}
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                return await self._http.request(method, url, headers=all_headers, data=data)
            except (TimeoutError, aiohttp.ClientConnectionError) as err:
                if data is not None or attempt == CONNECT_ATTEMPTS:
                    reason = one_line(str(err) or type(err).__name__, 200)
                    where = f"{url.host}:{url.port}"
                    raise self.fail(f"registry {where} unreachable ({reason})") from err
                await asyncio.sleep(RETRY_DELAY_S * attempt)
        raise AssertionError("unreachable")

    async def _checked(self, resp: aiohttp.ClientResponse, what: str) -> None:
        """Turn a non-2xx answer into this session's error, naming ``what``."""
        if resp.status < 300:
            return
        body = await resp.read()
        if resp.status == 401:
            raise self.fail(f"{what}: unauthorized ({registry_error_message(resp.status, body)})")
        if resp.status == 404:
            raise self.fail(
                f"{what}: not found in the registry ({registry_error_message(resp.status, body)})"
            )
        raise self.fail(f"{what}: {registry_error_message(resp.status, body)}")

    # -- manifests -------------------------------------------------------------------
    async def get_manifest(self, reference: str) -> tuple[bytes, str]:
        """The manifest (or index) bytes and media type; a digest reference is verified."""
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        async with await self._request(
            "GET", self._repo_url / "manifests" / reference, headers=headers
        ) as resp:
            await self._checked(resp, f"manifest {reference}")
            body = await self._read_limited(resp, MANIFEST_MAX_BYTES)
            media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            blob = json.loads(body)
        except ValueError as err:
            raise self.fail(f"manifest {reference}: not JSON") from err
        shape = MEDIA_OCI_INDEX if "manifests" in blob else MEDIA_OCI_MANIFEST
        header_type = media_type if media_type in MANIFEST_TYPES else shape
        media_type = blob.get("mediaType") or header_type
        if reference.startswith("sha256:"):
            self.verify(reference, body)
        return body, media_type

    async def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        async with await self._request(
            "PUT",
            self._repo_url / "manifests" / reference,
            headers={"Content-Type": media_type},
            data=body,
        ) as resp:
            await self._checked(resp, f"put manifest {reference}")
        return digest_of(body)

    async def _read_limited(self, resp: aiohttp.ClientResponse, limit: int) -> bytes:
        body = bytearray()
        async for chunk in resp.content.iter_chunked(CHUNK):
            body += chunk
            if len(body) > limit:
                raise self.fail(f"{resp.url.path}: answer larger than {limit} bytes")
        return bytes(body)

    def verify(self, expected: str, body: bytes) -> None:
        got = digest_of(body)
        if got != expected:
            raise self.fail(f"digest mismatch for {expected} (got {got})")

    # -- blobs -----------------------------------------------------------------------
    async def get_blob(self, digest: str, max_bytes: int = MANIFEST_MAX_BYTES) -> bytes:
        """A small blob (an image config), verified."""
        async with await self._request("GET", self._repo_url / "blobs" / digest) as resp:
            await self._checked(resp, f"blob {digest}")
            body = await self._read_limited(resp, max_bytes)
        self.verify(digest, body)
        return body

    async def blob_chunks(
        self, digest: str, size: int, progress: Progress | None = None
    ) -> AsyncIterator[bytes]:
        """Stream a blob; the digest is checked after the last chunk (raises on mismatch)."""
        hasher, done = hashlib.sha256(), 0
        async with await self._request("GET", self._repo_url / "blobs" / digest) as resp:
            await self._checked(resp, f"blob {digest}")
            async for chunk in resp.content.iter_chunked(CHUNK):
                hasher.update(chunk)
                done += len(chunk)
                if progress:
                    progress(digest, done, size)
                yield chunk
        got = "sha256:" + hasher.hexdigest()
        if got != digest:
            raise self.fail(f"digest mismatch for {digest} (got {got})")

    async def has_blob(self, digest: str) -> bool:
        async with await self._request("HEAD", self._repo_url / "blobs" / digest) as resp:
            if resp.status == 404:
                return False
            await self._checked(resp, f"blob {digest}")
        return True

    async def upload_blob(self, digest: str, size: int, chunks: AsyncIterator[bytes]) -> None:
        """Monolithic upload: ``POST`` an upload session, ``PUT`` the bytes with the digest."""
        async with await self._request(
            "POST", self._repo_url / "blobs" / "uploads" / "", data=b""
        ) as resp:
            await self._checked(resp, f"start upload of {digest}")
            location = URL(resp.headers["Location"])
        target = location if location.is_absolute() else self._root.join(location)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        async with await self._request(
            "PUT", target.update_query(digest=digest), headers=headers, data=chunks
        ) as resp:
            await self._checked(resp, f"upload {digest}")


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()
