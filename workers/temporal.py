"""One way to connect to Temporal, for every Corral process.

Address, namespace, TLS and API key come from `StackConfig`, so a node can
join a remote cluster or Temporal Cloud by configuration alone. The pydantic
data converter carries Corral's models; the tracing interceptor makes the
SDK call, the workflow and its activities one trace.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import RPCError

from observability.tracing import temporal_tracing_interceptor
from sandbox.errors import CorralError
from workers.config import StackConfig


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
        raise TemporalUnavailable(
            f"cannot reach Temporal at {t.address} (namespace {t.namespace}): "
            f"{' '.join(str(err).split())[:200]}; is the stack up? try `corral up`"
        ) from err
