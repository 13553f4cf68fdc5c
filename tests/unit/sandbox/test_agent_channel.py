"""The exec agent's framing (sandbox/agent.py; the agent's side is agent/proto.go)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import zlib
from pathlib import Path

import pytest

from contract.errors import ExecFailed, FileNotFound, SandboxError
from sandbox.agent import (
    HEADER,
    MAGIC,
    AgentChannel,
    AgentProtocolError,
    FrameDecoder,
    _error_of,
    encode_frame,
)


def test_a_frame_is_header_meta_data() -> None:
    raw = encode_frame(7, {"op": "run", "shell": "echo hi"}, b"stdin")
    magic, call_id, meta_len, data_len, crc = HEADER.unpack_from(raw)
    assert (magic, call_id, data_len) == (MAGIC, 7, 5)
    assert crc == zlib.crc32(raw[:16])
    meta = raw[HEADER.size : HEADER.size + meta_len]
    assert json.loads(meta) == {"op": "run", "shell": "echo hi"}
    assert raw[HEADER.size + meta_len :] == b"stdin"


def test_frames_come_out_whole_however_the_bytes_are_split() -> None:
    stream = b"".join(
        encode_frame(i, {"op": "out", "n": i}, bytes([i]) * (i * 1000)) for i in range(1, 6)
    )
    for step in (1, 7, 4096, len(stream)):
        decoder = FrameDecoder()
        frames = []
        for start in range(0, len(stream), step):
            frames += decoder.feed(stream[start : start + step])
        assert [f.call_id for f in frames] == [1, 2, 3, 4, 5]
        assert [f.meta["n"] for f in frames] == [1, 2, 3, 4, 5]
        assert all(f.data == bytes([f.call_id]) * (f.call_id * 1000) for f in frames)


def test_an_empty_data_part_and_a_partial_header_wait_for_more() -> None:
    decoder = FrameDecoder()
    raw = encode_frame(1, {"op": "hello"})
    assert decoder.feed(raw[:10]) == []
    [frame] = decoder.feed(raw[10:])
    assert frame.meta == {"op": "hello"} and frame.data == b""


def test_a_corrupt_header_is_refused() -> None:
    raw = bytearray(encode_frame(1, {"op": "hello"}))
    raw[5] ^= 0xFF  # the call id, under the checksum
    with pytest.raises(AgentProtocolError, match="bad frame header"):
        FrameDecoder().feed(bytes(raw))
    with pytest.raises(AgentProtocolError):
        FrameDecoder().feed(b"GARBAGE-GARBAGE-GARBAGE")


def test_oversized_frames_are_refused_both_ways() -> None:
    head = struct.pack(">4sIII", MAGIC, 1, 2, 64 << 20)
    with pytest.raises(AgentProtocolError, match="too large"):
        FrameDecoder().feed(head + struct.pack(">I", zlib.crc32(head)))
    with pytest.raises(ValueError, match="too large"):
        encode_frame(1, {}, b"x" * ((8 << 20) + 1))


def test_meta_must_be_json() -> None:
    head = struct.pack(">4sIII", MAGIC, 1, 3, 0)
    with pytest.raises(AgentProtocolError, match="not JSON"):
        FrameDecoder().feed(head + struct.pack(">I", zlib.crc32(head)) + b"{{{")


def test_agent_errors_map_to_sandbox_errors() -> None:
    assert isinstance(_error_of({"kind": "not_found", "error": "read /x: no"}), FileNotFound)
    assert isinstance(_error_of({"kind": "start_failed", "error": "nope"}), ExecFailed)
    err = _error_of({"kind": "io", "error": "disk full"})
    assert type(err) is SandboxError and str(err) == "disk full"


def test_with_the_agent_it_is_pid_1_mounted_read_only_and_without_it_nothing_changes() -> None:
    from pathlib import Path

    from sandbox.models import SandboxSpec
    from sandbox.spec import AGENT_PATH, INIT_PATH, build_oci_spec

    spec = SandboxSpec(image="busybox", user_namespace=False)
    off = build_oci_spec("sb", spec)
    assert off["process"]["args"][0] == INIT_PATH
    assert AGENT_PATH not in [m["destination"] for m in off["mounts"]]
    on = build_oci_spec("sb", spec, agent=Path("/opt/corral-agent"))
    assert on["process"]["args"] == [AGENT_PATH, "--", *spec.command]
    [mount] = [m for m in on["mounts"] if m["destination"] == AGENT_PATH]
    assert mount["source"] == "/opt/corral-agent" and "ro" in mount["options"]
    assert INIT_PATH not in [m["destination"] for m in on["mounts"]]


def test_the_agent_is_on_by_default_and_turned_off_by_config_or_env() -> None:
    from contract.config import load_config

    assert load_config(env={}).workers.exec_agent is True
    assert load_config(env={"CORRAL_EXEC_AGENT": "0"}).workers.exec_agent is False
    assert load_config(env={"CORRAL_EXEC_AGENT": "1"}).workers.exec_agent is True


def test_an_attached_channel_skips_what_the_old_reader_left_half_read() -> None:
    """A node worker that died mid-frame left the rest of it in the FIFO: the
    worker that attaches next skips to the first whole frame, then is strict."""
    old = encode_frame(3, {"op": "stdout"}, b"x" * 100)
    new = encode_frame(1 << 30, {"op": "hello", "version": 1})
    for cut in (1, 5, 19, 20, 57, len(old) - 1):
        decoder = FrameDecoder(resync=True)
        frames = [f for i in range(0, len(old) - cut + len(new), 7)
                  for f in decoder.feed((old[cut:] + new)[i : i + 7])]  # fmt: skip
        assert [(f.call_id, f.meta["op"]) for f in frames] == [(1 << 30, "hello")], cut
        assert decoder.skipped == len(old) - cut
        with pytest.raises(AgentProtocolError):
            decoder.feed(b"GARBAGE-GARBAGE-GARBAGE")


async def test_small_frames_go_at_once_and_never_overtake_queued_ones(tmp_path: Path) -> None:
    """A call's request is written straight away (no task); a frame too large for
    one FIFO write takes the queue, and a small one after it waits its turn."""
    channel = AgentChannel.prepare(tmp_path / "channel")
    agent_in = os.open(channel.stdin_path, os.O_RDONLY | os.O_NONBLOCK)
    agent_out = os.open(channel.stdout_path, os.O_WRONLY | os.O_NONBLOCK)  # the agent's end
    channel.start()
    decoder, seen = FrameDecoder(), list[int]()

    def read_some() -> None:
        with contextlib.suppress(BlockingIOError):
            seen.extend(frame.call_id for frame in decoder.feed(os.read(agent_in, 1 << 20)))

    try:
        await channel._send(1, {"op": "hello"})
        read_some()
        assert seen == [1]
        big = asyncio.ensure_future(channel._send(2, {"op": "put_data"}, b"x" * (1 << 20)))
        await asyncio.sleep(0)  # it fills the FIFO and waits for room
        small = asyncio.ensure_future(channel._send(3, {"op": "hello"}))
        while not (big.done() and small.done()):
            read_some()
            await asyncio.sleep(0.001)
        read_some()
        assert seen == [1, 2, 3]
    finally:
        channel.close()
        os.close(agent_in)
        os.close(agent_out)
