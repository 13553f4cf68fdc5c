"""Every Corral process reaches Temporal over TLS with an API key (issue 9).

Debian's nginx stands in for a TLS-terminating, API-key-checking frontend (as
Temporal Cloud is): it serves a certificate from a throwaway CA, answers any
request whose `authorization` is not `Bearer <key>` with gRPC UNAUTHENTICATED,
and passes the rest to the dev server, which `corral up --role control`
starts on a loopback port of its own (`temporal.dev_server.listen`). The
stack and a node joined by name are pointed at the proxy by environment only;
a one-step episode runs through it, and the proxy's access log shows which
process sent which calls, all with the key.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import corral, processes_of

from tests.net import free_port, listening

pytestmark = pytest.mark.integration

API_KEY = "corral-e2e-key"
NODE = "tls-1"
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Proxy:
    port: int
    ca: Path
    access_log: Path
    process: subprocess.Popen[bytes]


@dataclass(frozen=True)
class LoggedCall:
    client_port: int
    method: str
    status: int
    key: str  # ok | wrong | none: the log never holds the key itself
    grpc_status: str


def make_ca_and_server_cert(folder: Path) -> tuple[Path, Path, Path]:
    """(CA, server certificate, key) for 127.0.0.1 and localhost.

    workers/tls.py's dev certificate is its own CA (CA:TRUE), which the SDK's
    TLS stack (rustls) refuses as a server's (CaUsedAsEndEntity): a CA signs this one.
    """
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, csr = folder / "server.pem", folder / "server.key", folder / "server.csr"
    ext = folder / "server.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=corral-e2e-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    _openssl("req", *ec, "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return ca, cert, key


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"openssl {args[0]}: {done.stderr}"


def nginx_conf(folder: Path, listen: int, upstream: str, cert: Path, key: Path) -> str:
    # Long polls last about a minute: nginx's 60 s defaults would cut them off.
    # The `if` answers a trailers-only gRPC response, so the SDK reports the status.
    return f"""
daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 256; }}
http {{
  client_body_temp_path {folder}/body;
  map $http_authorization $api_key {{ "" none; "Bearer {API_KEY}" ok; default wrong; }}
  log_format grpc '$remote_port "$request" $status key=$api_key '
                  'grpc=$sent_http_grpc_status/$sent_trailer_grpc_status';
  access_log {folder}/access.log grpc;
  server {{
    listen 127.0.0.1:{listen} ssl http2;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    keepalive_requests 1000000;
    keepalive_timeout 3600s;
    client_max_body_size 0;
    grpc_read_timeout 300s;
    grpc_send_timeout 300s;
    location / {{
      default_type application/grpc;
      if ($api_key != ok) {{
        add_header grpc-status 16 always;
        add_header grpc-message "missing or wrong API key" always;
        return 200;
      }}
      grpc_pass grpc://{upstream};
    }}
  }}
}}
"""


def start_proxy(folder: Path, upstream: str) -> Proxy:
    folder.chmod(0o755)  # nginx's worker (nobody, when run as root) keeps request bodies here
    ca, cert, key = make_ca_and_server_cert(folder)
    port = free_port()
    conf = folder / "nginx.conf"
    conf.write_text(nginx_conf(folder, port, upstream, cert, key))
    output = folder / "nginx.out"
    with output.open("wb") as log:
        process = subprocess.Popen(
            ["nginx", "-c", str(conf), "-p", str(folder)], stdout=log, stderr=subprocess.STDOUT
        )
    proxy = Proxy(port=port, ca=ca, access_log=folder / "access.log", process=process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (folder / "nginx.pid").exists():  # written once it listens
        if process.poll() is not None or time.monotonic() > deadline:
            stop_proxy(proxy)
            raise AssertionError(f"nginx did not start: {output.read_text()}")
        time.sleep(0.1)
    return proxy


def stop_proxy(proxy: Proxy) -> None:
    proxy.process.send_signal(signal.SIGQUIT)  # graceful: workers finish, then exit
    try:
        proxy.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proxy.process.kill()
        proxy.process.wait()


def read_access_log(proxy: Proxy) -> list[LoggedCall]:
    pattern = re.compile(r'(\d+) "POST /([\w.]+)/(\w+) HTTP/2.0" (\d+) key=(\w+) grpc=(\S+)')
    calls = []
    for line in proxy.access_log.read_text().splitlines():
        found = pattern.match(line)
        if found:
            port, _service, method, status, key, grpc = found.groups()
            calls.append(LoggedCall(int(port), method, int(status), key, grpc))
    return calls


def proxy_client_ports(pid: int, proxy_port: int) -> set[int]:
    """Local ports of `pid`'s TCP connections to the proxy: which process sent a logged call."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            sockets.add(os.readlink(fd))
        except OSError:
            continue  # closed while we looked
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(remote.split(":")[1], 16) == proxy_port and f"socket:[{inode}]" in sockets:
            ports.add(int(local.split(":")[1], 16))
    return ports


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not listening(port):
        assert time.monotonic() < deadline, f"nothing listens on 127.0.0.1:{port}"
        time.sleep(0.1)


def stack_pid(state: str, name: str) -> int:
    return int((Path(state) / "run" / f"{name}.pid").read_text().strip())


@pytest.fixture(scope="module")
def tls_env() -> Iterator[tuple[dict[str, str], Proxy]]:
    state = Path(tempfile.mkdtemp(prefix="corral-e2e-tls-", dir="/tmp"))
    proxy_dir = Path(tempfile.mkdtemp(prefix="corral-e2e-tls-proxy-", dir="/tmp"))
    # Below 32768, the kernel's ephemeral range: nginx's own connections to the
    # dev server take ports from there, and once took the sensor's metrics port.
    offset = int(os.environ.get("CORRAL_TEST_PORT_OFFSET", "0"))
    dev_server = f"127.0.0.1:{24233 + offset}"
    proxy = start_proxy(proxy_dir, upstream=dev_server)
    env = {
        **os.environ,
        "CORRAL_STATE_DIR": str(state),
        # Clients (every process of the stack) use the proxy; only `up` sees the dev server.
        "CORRAL_TEMPORAL_ADDRESS": f"127.0.0.1:{proxy.port}",
        "CORRAL_TEMPORAL_DEV_LISTEN": dev_server,
        "CORRAL_TEMPORAL_TLS": "1",
        "CORRAL_TEMPORAL_TLS_CA": str(proxy.ca),
        "CORRAL_TEMPORAL_API_KEY": API_KEY,
        "CORRAL_TEMPORAL_UI_PORT": str(24333 + offset),
        "CORRAL_TEMPORAL_METRICS_PORT": str(24433 + offset),
        "CORRAL_METRICS_PORT_BASE": str(24460 + offset),
        "CORRAL_INTAKE_PORT": str(24765 + offset),
        "CORRAL_NODES": "1",
        "CORRAL_WARM_POOL": "",
    }
    try:
        yield env, proxy
    finally:
        corral("down", env=env, check=False)
        stop_proxy(proxy)
        left = processes_of(str(state)) + processes_of(str(proxy_dir))
        mounted = [m for m in Path("/proc/mounts").read_text().splitlines() if str(state) in m]
        if not left and not mounted:
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(proxy_dir, ignore_errors=True)
        assert left == [] and mounted == [], (left, mounted)


def test_every_process_reaches_temporal_through_tls_with_the_key(
    tls_env: tuple[dict[str, str], Proxy],
) -> None:
    env, proxy = tls_env
    state = env["CORRAL_STATE_DIR"]
    corral("up", "--role", "control", env=env)
    assert "tls-1 is up" in corral("node", "up", "--name", NODE, env=env).stdout

    ran = corral(
        "episode", "start", "--image", "busybox", "--step", "echo through-the-proxy",
        "--node", NODE, "--wait", "--json", env=env,
    )  # fmt: skip
    result = json.loads(ran.stdout)
    assert result["outcome"] == "completed" and result["node"] == NODE, result
    assert result["steps"][0]["stdout"] == "through-the-proxy\n"

    wait_listening(int(env["CORRAL_INTAKE_PORT"]))  # the intake listens once it has connected
    calls = read_access_log(proxy)
    assert calls and all(c.key == "ok" and c.status == 200 for c in calls), calls
    by_process = {
        name: _methods_of(calls, proxy_client_ports(stack_pid(state, name), proxy.port))
        for name in ("workflow-worker", f"node-worker-{NODE}", "intake")
    }
    assert {"PollWorkflowTaskQueue", "RespondWorkflowTaskCompleted"} <= by_process[
        "workflow-worker"
    ], by_process
    # The node worker's heartbeat to the node registry is a signal-with-start.
    node_calls = {
        "PollActivityTaskQueue",
        "RespondActivityTaskCompleted",
        "SignalWithStartWorkflowExecution",
    }
    assert node_calls <= by_process[f"node-worker-{NODE}"], by_process
    assert "GetSystemInfo" in by_process["intake"], by_process
    # `corral up` made the janitor schedule through the proxy too.
    assert any(c.method == "CreateSchedule" for c in calls)


def _methods_of(calls: list[LoggedCall], ports: set[int]) -> set[str]:
    assert ports, "the process holds no connection to the proxy"
    return {c.method for c in calls if c.client_port in ports}


def test_a_wrong_key_or_no_tls_fails_with_one_clear_line(
    tls_env: tuple[dict[str, str], Proxy],
) -> None:
    env, proxy = tls_env
    wrong = corral("episode", "list", env={**env, "CORRAL_TEMPORAL_API_KEY": "x"}, check=False)
    assert wrong.returncode != 0
    lines = wrong.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the credentials" in lines[0], wrong.stderr
    assert "missing or wrong API key" in lines[0] and "CORRAL_TEMPORAL_API_KEY" in lines[0]
    assert any(c.key == "wrong" and c.grpc_status.startswith("16") for c in read_access_log(proxy))

    plain = corral("episode", "list", env={**env, "CORRAL_TEMPORAL_TLS": "0"}, check=False)
    assert plain.returncode != 0
    lines = plain.stderr.strip().splitlines()
    assert len(lines) == 1 and "CORRAL_TEMPORAL_TLS=1" in lines[0], plain.stderr

    untrusted = {k: v for k, v in env.items() if k != "CORRAL_TEMPORAL_TLS_CA"}
    unknown_ca = corral("episode", "list", env=untrusted, check=False)
    lines = unknown_ca.stderr.strip().splitlines()
    assert len(lines) == 1 and "UnknownIssuer" in lines[0], unknown_ca.stderr


def test_down_leaves_nothing(tls_env: tuple[dict[str, str], Proxy]) -> None:
    env, _proxy = tls_env
    corral("down", env=env)
    assert processes_of(env["CORRAL_STATE_DIR"]) == []
