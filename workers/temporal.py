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


def _tls(config: StackConfig) -> TLSConfig | bool:
    t = config.temporal
    if not t.tls:
        return False
    if t.tls_cert and t.tls_key:
        return TLSConfig(
            client_cert=Path(t.tls_cert).read_bytes(),
            client_private_key=Path(t.tls_key).read_bytes(),
        )
    return True


async def connect(config: StackConfig, *, runtime: Runtime | None = None) -> Client:
    t = config.temporal
    try:
        return await Client.connect(
            t.address,
            namespace=t.namespace,
            data_converter=pydantic_data_converter,
            interceptors=[temporal_tracing_interceptor()],
            tls=_tls(config),
            api_key=t.api_key,
            runtime=runtime,
        )
    except (RPCError, RuntimeError, OSError) as err:
        raise TemporalUnavailable(
            f"cannot reach Temporal at {t.address} (namespace {t.namespace}): "
            f"{' '.join(str(err).split())[:200]}; is the stack up? try `corral up`"
        ) from err
