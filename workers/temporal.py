"""One way to connect to Temporal, for every Corral process.

Address, namespace, TLS and API key come from `StackConfig`, so a node can
join a remote cluster or Temporal Cloud by configuration alone. The pydantic
data converter carries Corral's models; the tracing interceptor makes the
SDK call, the workflow and its activities one trace.
"""

from __future__ import annotations

import re
from pathlib import Path

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from contract.config import StackConfig, TemporalConfig
from contract.errors import CorralError
from observability.tracing import temporal_tracing_interceptor

# The SDK's core reports a failed connect as text (tonic's Debug output), not as
# an RPCError: these pick the gRPC status and the TLS error out of it.
_STATUS = re.compile(r'Status \{ code: (\w+), message: "([^"]*)"')
_TLS_ERROR = re.compile(r"error: (Invalid\w+|AlertReceived|PeerMisbehaved)\(([\w(]+)")
_CREDENTIAL_CODES = {"unauthenticated", "permissiondenied"}
# What a plain-text client sees from a TLS port (nginx's HTTP/1 400, or a hang-up).
_PLAIN_TO_TLS = ("connection closed", "h2 protocol error")


class TemporalUnavailable(CorralError):
    """The Temporal frontend did not answer."""


def tls_config(config: StackConfig) -> TLSConfig | bool:
    """The SDK's TLS settings: mTLS client pair, a private CA, a server name."""
    t = config.temporal
    if not t.tls:
        return False
    if bool(t.tls_cert) != bool(t.tls_key):
        raise TemporalUnavailable("temporal.tls_cert and temporal.tls_key go together")
    if not (t.tls_cert or t.tls_ca or t.tls_server_name):
        return True  # the system's roots, as for Temporal Cloud with an API key
    try:
        return TLSConfig(
            client_cert=_read(t.tls_cert),
            client_private_key=_read(t.tls_key),
            server_root_ca_cert=_read(t.tls_ca),
            domain=t.tls_server_name,
        )
    except OSError as err:
        raise TemporalUnavailable(f"cannot read a Temporal TLS file: {err}") from err


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


async def connect(config: StackConfig, *, runtime: Runtime | None = None) -> Client:
    t = config.temporal
    try:
        return await Client.connect(
            t.address,
            namespace=t.namespace,
            data_converter=pydantic_data_converter,
            interceptors=[temporal_tracing_interceptor()],
            tls=tls_config(config),
            api_key=t.api_key,
            runtime=runtime,
        )
    except (RPCError, RuntimeError, OSError) as err:
        raise TemporalUnavailable(describe_connect_error(err, t)) from err


def describe_connect_error(err: BaseException, t: TemporalConfig) -> str:
    """One line that names the setting to check: the key, the TLS trust, or the address."""
    text = " ".join(str(err).split())
    where = f"Temporal at {t.address} (namespace {t.namespace})"
    code, message = _status_of(err, text)
    if code.replace("_", "").lower() in _CREDENTIAL_CODES:
        return (
            f"{where} refused the credentials ({code}: {message}); check temporal.api_key "
            "(CORRAL_TEMPORAL_API_KEY) or the mTLS pair (CORRAL_TEMPORAL_TLS_CERT, _KEY)"
        )
    tls_error = _TLS_ERROR.search(text)
    if tls_error:
        kind, nested = tls_error.groups()  # e.g. InvalidCertificate, Other(OtherError(CaUsed...
        return (
            f"TLS with {where} failed ({kind} {nested.split('(')[-1]}); check temporal.tls_ca "
            "(CORRAL_TEMPORAL_TLS_CA), temporal.tls_server_name, and that it serves TLS"
        )
    if not t.tls and any(sign in text for sign in _PLAIN_TO_TLS):
        return f"{where} closed the connection; does it require TLS (CORRAL_TEMPORAL_TLS=1)?"
    return f"cannot reach {where}: {text[:200]}; is the stack up? try `corral up`"


def _status_of(err: BaseException, text: str) -> tuple[str, str]:
    """(gRPC status name, message) of a refused call; ("", "") if it was no status."""
    if isinstance(err, RPCError):
        return RPCStatusCode(err.status).name, err.message
    found = _STATUS.search(text)
    return (found.group(1), found.group(2)) if found else ("", "")


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox still guards determinism (time, random, I/O calls), but every
    module is passed through instead of re-imported for each workflow run: the
    re-import of pydantic models cost more CPU than the workflow itself."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_all_modules()
    )
