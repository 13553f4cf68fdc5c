"""On-call in a real browser: headless Chromium (Debian's `chromium`) on the Web UI.

A write below /bin quarantines an episode on a one-node stack of this
module's own; the browser then finds it with the `EpisodeState` filter
on-call bookmarks (docs/oncall.md), and its page shows what on-call needs to
decide: the state, the node and the Falco rule (search attributes), the
reason (memo) and the summary the SDK wrote (history). Chromium is driven
over the DevTools protocol (a websocket), reading the page's rendered text.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import shutil
import signal
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from contract.config import StackConfig, load_config
from corral import Corral, Episode
from tests.integration import conftest as integration
from tests.integration.conftest import REPO, wait_for
from tests.net import free_port
from workers.stack import Stack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium absent"),
]

RULE = "Write below binary dir in sandbox"  # its response quarantines
QUARANTINED = 'EpisodeState="quarantined"'  # the filter docs/oncall.md bookmarks
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
PAGE_CAP_S = 180.0  # a cap so a broken UI fails instead of hanging; not a target


class Page:
    """One browser tab over the DevTools protocol: navigate, read the rendered text."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        while True:  # events arrive in between; skip them
            message = await self._ws.receive_json()
            if message.get("id") == call_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def text(self) -> str:
        reply = await self.call(
            "Runtime.evaluate", expression="document.body.innerText", returnByValue=True
        )
        return str(reply["result"].get("value") or "")

    async def wait_text(self, done: Callable[[str], bool]) -> str:
        """The page's text once `done` holds (the Web UI renders after its API calls)."""
        deadline = time.monotonic() + PAGE_CAP_S
        text = ""
        while time.monotonic() < deadline:
            text = await self.text()
            if done(text):
                return text
            await asyncio.sleep(0.5)
        where = await self.call(
            "Runtime.evaluate", expression="location.href + ' ' + document.readyState",
            returnByValue=True,
        )  # fmt: skip
        shown = " ".join(text.split())[:3000]
        raise AssertionError(f"{where['result'].get('value')} never showed it; it showed: {shown}")


async def _page_socket(http: aiohttp.ClientSession, port: int) -> str:
    """The DevTools websocket of Chromium's first tab, once it answers."""
    deadline = time.monotonic() + PAGE_CAP_S
    while time.monotonic() < deadline:
        try:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                pages = [t for t in await response.json() if t["type"] == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.3)
    raise AssertionError(f"chromium's DevTools did not answer on port {port}")


@pytest.fixture(scope="module")
def webui_config() -> Iterator[StackConfig]:
    """A one-node stack of this module's own (ports 28233... + the test offset: not the
    session stack's, nor the 30000-up family episodes/conftest.py shifts it to, and
    below 32768, the kernel's ephemeral range), so that it runs beside the
    integration session's stack, also in one pytest run."""
    offset = int(os.environ.get("CORRAL_TEST_PORT_OFFSET", "0"))
    ports = {
        "CORRAL_TEMPORAL_ADDRESS": f"127.0.0.1:{28233 + offset}",
        "CORRAL_TEMPORAL_UI_PORT": str(28333 + offset),
        "CORRAL_TEMPORAL_METRICS_PORT": str(28433 + offset),
        "CORRAL_METRICS_PORT_BASE": str(28460 + offset),
        "CORRAL_INTAKE_PORT": str(28765 + offset),
    }
    state = tempfile.mkdtemp(prefix="corral-webui-", dir="/tmp")
    env = {**integration.TEST_ENV, **ports, "CORRAL_NODES": "1", "CORRAL_STATE_DIR": state}
    with pytest.MonkeyPatch.context() as patch:  # the stack's processes inherit these
        for key, value in env.items():
            patch.setenv(key, value)
        yield load_config(REPO / "temporal-dev.yaml")


@pytest_asyncio.fixture(scope="module")
async def webui_stack(webui_config: StackConfig) -> AsyncIterator[Stack]:
    stack = Stack(webui_config)
    try:
        await stack.up()
        yield stack
        leftovers = await integration.sandboxes_left(webui_config)
    finally:
        await stack.down()
    assert not leftovers, f"the web UI test left sandboxes behind: {leftovers}"


@pytest_asyncio.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    port = free_port()
    browser = await asyncio.create_subprocess_exec(
        "chromium", *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
        f"--remote-debugging-port={port}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # its renderer and zygote children share its group
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            socket_url = await _page_socket(http, port)
            async with http.ws_connect(socket_url, max_msg_size=0) as ws:
                yield Page(ws)
    finally:
        os.killpg(browser.pid, signal.SIGKILL)
        await browser.wait()


async def _quarantined(corral: Corral) -> Episode:
    """An episode quarantined by a real alert, once the visibility store lists it so."""
    episode = await corral.start_episode({"image": "busybox"})
    await episode.exec("echo x > /bin/corral-webui-test")

    async def listed() -> bool:
        rows = await corral.list_episodes(f"WorkflowId = '{episode.id}'")
        return bool(rows) and rows[0].state == "quarantined"

    await wait_for(listed, timeout_s=PAGE_CAP_S)
    return episode


async def test_oncall_finds_a_quarantined_episode_and_sees_why(
    webui_stack: Stack, page: Page
) -> None:
    stack = webui_stack
    async with await Corral.connect(stack.config) as corral:
        await _quarantined_and_seen(stack, corral, page)


async def _quarantined_and_seen(stack: Stack, corral: Corral, page: Page) -> None:
    episode = await _quarantined(corral)
    try:
        status = await episode.status()
        assert status.state == "quarantined" and RULE in status.reason, status
        ui = stack.config.ui_url
        query = urllib.parse.quote(QUARANTINED)
        await page.goto(f"{ui}?query={query}")
        await page.wait_text(lambda text: episode.id in text)

        run_id = (await corral.client.get_workflow_handle(episode.id).describe()).run_id
        # The episode's page has a tab per view (the tab is in the URL).
        views = {
            "search-attributes": ("quarantined", status.node, RULE),
            "memo": (status.reason,),  # the same fields as the current details
            "history": ("busybox: 0 steps",),  # the summary the SDK wrote at start
        }
        for view, needs in views.items():
            await page.goto(f"{ui}/{episode.id}/{run_id}/{view}")
            await page.wait_text(functools.partial(_shows_all, needs))
    finally:
        await episode.kill(reason="web UI test done", by="test")
        await asyncio.wait_for(_ended(episode), PAGE_CAP_S)


def _shows_all(needs: tuple[str, ...], text: str) -> bool:
    return all(need in text for need in needs)


async def _ended(episode: Episode) -> None:
    try:
        await episode.result()
    except Exception as err:  # killed: that is how it ends
        assert "kill" in str(err).lower(), err


def test_the_oncall_doc_bookmarks_the_filter_used_here() -> None:
    doc = (REPO / "docs" / "oncall.md").read_text()
    assert f"/workflows?query={urllib.parse.quote(QUARANTINED)}" in doc
