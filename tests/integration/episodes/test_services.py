"""`services:` end to end on the session stack: a SQL database beside the agent,
queried by name, forked with it (its data too), torn down with it; a service watched by the
sensor; a service that never gets ready fails its episode and leaves nothing.

The session stack runs without a warm pool (tests/integration/conftest.py);
the warm path is tests/integration/detection/test_services_warm.py.
"""

from __future__ import annotations

import pytest

from contract.config import StackConfig
from contract.labels import SERVICE_OF_LABEL
from corral import Corral
from corral.errors import EpisodeFailed, InvalidEpisodeSpec
from tests.integration.conftest import wait_for
from tests.integration.episodes.episode_helpers import labelled

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# A Postgres-like service: SQL over TCP on port 5432 (sqlite behind a line protocol),
# its data on its own disk, as a database's is: a fork's children inherit it.
DATABASE = r"""
import json, os, socketserver, sqlite3
fresh = not os.path.exists("/var/lib/facts.db")
db = sqlite3.connect("/var/lib/facts.db", check_same_thread=False)
if fresh:
    db.execute("create table facts (k text, v int)")
    db.execute("insert into facts values ('answer', 42)")
    db.commit()
class Session(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            rows = db.execute(line.decode()).fetchall()
            db.commit()
            self.wfile.write((json.dumps(rows) + "\n").encode())
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("127.0.0.1", 5432), Session).serve_forever()
"""
QUERY = """\
import socket, sys
with socket.create_connection(("db", 5432), timeout=5) as conn:
    conn.sendall(sys.argv[1].encode() + b"\\n")
    print(conn.makefile().readline().strip())
"""
NOTICE_RULE = "Write below etc in sandbox"


def world(image: str) -> dict[str, object]:
    return {
        "image": image,
        "files": [{"path": "/query.py", "content": QUERY}],
        "services": [
            {
                "name": "db",
                "image": image,
                "command": ["python3", "-c", DATABASE],
                "ready": {"tcp_port": 5432, "timeout_s": 60},
            }
        ],
    }


async def services_of(config: StackConfig, sandbox_id: str) -> list[tuple[str, str]]:
    return await labelled(config, {SERVICE_OF_LABEL: sandbox_id})


async def test_an_agent_queries_its_database_by_name_forks_and_leaves_nothing(
    corral: Corral, python_image: str, stack_config: StackConfig
) -> None:
    query = "python3 /query.py"
    async with await corral.start_episode(world(python_image)) as episode:
        step = await episode.exec(f"{query} \"select v from facts where k = 'answer'\"")
        assert (step.exit_code, step.stdout) == (0, "[[42]]\n"), step.stderr
        insert = await episode.exec(f"{query} \"insert into facts values ('parent', 1)\"")
        assert insert.exit_code == 0, insert.stderr
        sandbox_id = (await episode.status()).sandbox_id
        assert len(await services_of(stack_config, sandbox_id)) == 1

        children = await episode.fork(2)
        child_sandboxes = []
        count = f'{query} "select count(*) from facts"'
        for i, child in enumerate(children):
            async with child:
                # The database forked with the agent: the parent's row is there...
                again = await child.exec(count)
                assert (again.exit_code, again.stdout) == (0, "[[2]]\n"), again.stderr
                # ... and what one child writes stays its own.
                if i == 0:
                    mine = await child.exec(f"{query} \"insert into facts values ('child', 1)\"")
                    assert mine.exit_code == 0, mine.stderr
                    assert (await child.exec(count)).stdout == "[[3]]\n"
                child_sandboxes.append((await child.status()).sandbox_id)
                await child.finish()
        assert (await episode.exec(count)).stdout == "[[2]]\n"
        result = await episode.finish()
    assert result.outcome == "completed"
    for each in (sandbox_id, *child_sandboxes):
        assert await services_of(stack_config, each) == [], "a service outlived its episode"


async def test_a_service_is_watched_by_the_sensor(corral: Corral) -> None:
    spec = {
        "image": "busybox",
        "services": [
            {
                "name": "web",
                "image": "busybox",
                "command": "echo x > /etc/service-note; mkdir -p /www; "
                "echo web-ok > /www/index.html; exec httpd -f -p 80 -h /www",
                "ready": {"tcp_port": 80},
            }
        ],
    }
    async with await corral.start_episode(spec) as episode:
        step = await episode.exec("wget -qO- http://web/")
        assert (step.exit_code, step.stdout) == (0, "web-ok\n"), step.stderr

        async def alerted() -> bool:  # raised in the service, charged to the episode
            return NOTICE_RULE in (await episode.status()).anomaly_rules

        await wait_for(alerted, timeout_s=60)
        await episode.finish()


@pytest.mark.parametrize(
    ("command", "ready", "why"),
    [
        ("sleep 1000", {"tcp_port": 9, "timeout_s": 2}, "service 'db' not ready after 2 s"),
        ("exit 3", {"cmd": "true", "timeout_s": 30}, "service 'db' exited before it was ready"),
    ],
)
async def test_a_service_that_never_gets_ready_fails_the_episode(
    corral: Corral, command: str, ready: dict[str, object], why: str
) -> None:
    service = {"name": "db", "image": "busybox", "command": command, "ready": ready}
    for scripted in (True, False):  # the lean path and the step-by-step one
        spec = {"image": "busybox", "services": [service], "steps": ["true"] if scripted else []}
        episode = await corral.start_episode(spec)
        with pytest.raises(EpisodeFailed, match=why) as failed:
            await episode.result(timeout_s=120)
        assert failed.value.result is not None and failed.value.result.outcome == "failed"


async def test_a_bad_services_spec_fails_at_start(corral: Corral) -> None:
    service = {"name": "db", "image": "busybox", "command": "true"}
    with pytest.raises(InvalidEpisodeSpec, match="unique"):
        await corral.start_episode({"image": "busybox", "services": [service, service]})
    with pytest.raises(InvalidEpisodeSpec, match="name"):
        await corral.start_episode({"image": "busybox", "services": [{**service, "name": "DB!"}]})
