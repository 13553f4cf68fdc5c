"""The compiled backend's binary records -> ``Event``: a sibling of ``parser.Parser``.

``bpf/corral-sensor-bpf`` writes the ring buffer's records (layout in
``bpf/record.h``) to stdout back to back; each starts with its own length.
One record per syscall, exec enter/exit, fork and exit, strings inline.
``BinaryParser.feed_bytes`` decodes each into the list a bpftrace JSON record
holds (``(code, nsecs, tid, pid, cgid, uid, gid, comm, ...)``) with its
strings stashed where the JSON path keeps them, and hands it to
``Parser.record``: exec assembly, the fd table, the prefilter and the
deferred ``/proc`` completion are the same code for both backends.
"""

from __future__ import annotations

import struct
from typing import Any

from policies.falco.event import Event
from policies.sensor import program as pg
from policies.sensor.parser import Parser, _PendingExec

# record.h
STR_MAX = 256
N_VALS = 6
REC_ATTACHED = 9  # the loader attached every program
REC_LOST = 10  # records the ring buffer had no room for
REC_TICK = 11  # the loader's answer to `tick N`: every record before it is above

HDR = struct.Struct("<HBBHHIIQQII16s")  # struct rec_hdr
SYSCALL = struct.Struct(f"<q{N_VALS}Q")  # res, v[]
EXEC_ENTER = struct.Struct("<II")  # argc, pad
EXEC_EXIT = struct.Struct("<qIIQQIIIIQqqqq")
FORK = struct.Struct("<II")
EXIT = struct.Struct("<q")
LOST = struct.Struct("<Q")
TICK = struct.Struct("<Q")
HDR_SIZE = HDR.size  # 56

_STR_SLOTS: dict[int, tuple[tuple[int, str], ...]] = {
    code: tuple((i, a.kind) for i, a in enumerate(pg.SYSCALLS[name][: pg.N_ARG_MAPS])
                if a.kind in (pg.STR, pg.SOCKADDR, pg.PEER))
    for name, code in pg.CODES.items()
}  # fmt: skip
# Where each slot's value sits in v[] (a HOW slot takes two values).
_VAL_INDEX: dict[int, tuple[int, ...]] = {}
for _name, _code in pg.CODES.items():
    _idx, _j = [], 0
    for _a in pg.SYSCALLS[_name][: pg.N_ARG_MAPS]:
        _idx.append(_j)
        _j += 2 if _a.kind == pg.HOW else 1
    _VAL_INDEX[_code] = tuple(_idx)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class BinaryParser(Parser):
    """Feeds on the loader's byte stream; yields the events ``Parser`` would."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attached = False  # the loader said every program is attached
        self.watch_cgid: int | None = None  # a cgroup whose syscalls prove the probes live
        self.watch_seen = False
        self.tick = 0  # the highest `tick N` the loader answered

    def feed_bytes(self, data: bytes, out: list[Event]) -> int:
        """Decode the whole records in ``data`` (events appended to ``out``);
        returns the bytes consumed (a partial record at the end stays)."""
        off, n = 0, len(data)
        stats = self.stats
        wanted = self.wanted
        while off + HDR_SIZE <= n:
            size = data[off] | data[off + 1] << 8
            if size < HDR_SIZE:  # cannot happen with a sane loader: resync is impossible
                stats.bad_lines += 1
                return n
            if off + size > n:
                break
            stats.records += 1
            try:
                evt = self.binary_record(data, off, size)
            except (IndexError, KeyError, ValueError, struct.error):
                stats.bad_lines += 1
                evt = None
            off += size
            if evt is not None and (wanted is None or evt.type in wanted):
                evt = self._pass(evt)
                if evt is not None:
                    out.append(evt)
        return off

    def binary_record(self, data: bytes, off: int, size: int) -> Event | None:
        _size, code, flags, sc, _pad, tid, pid, ts, cgid, uid, gid, comm = HDR.unpack_from(
            data, off
        )
        body = off + HDR_SIZE
        d: list[Any] = [code, ts, tid, pid, cgid, uid, gid, _cstr(comm)]
        if code == pg.REC_SYSCALL:
            if cgid == self.watch_cgid:
                self.watch_seen = True
            res, *vals = SYSCALL.unpack_from(data, body)
            slots = _STR_SLOTS[sc]
            if slots:
                pos = body + SYSCALL.size
                where = _VAL_INDEX[sc]
                strs: dict[int, Any] = {}
                for i, kind in slots:
                    length = vals[where[i]]
                    raw = data[pos : pos + length]
                    pos += length
                    strs[i] = _cstr(raw) if kind == pg.STR else raw
                self._strs[tid] = strs
            self._cut = flags
            d += [sc, res, *vals]
        elif code == pg.REC_EXEC_ENTER:
            if cgid == self.watch_cgid:
                self.watch_seen = True
            (argc, _) = EXEC_ENTER.unpack_from(data, body)
            parts = data[body + EXEC_ENTER.size : off + size].split(b"\0")
            argv = [_text(a) for a in parts[1 : 1 + argc]]
            self._execs[tid] = _PendingExec(_text(parts[0]), argv)
            return None
        elif code == pg.REC_EXEC_EXIT:
            exe = EXEC_EXIT.unpack_from(data, body)
            res, ppid, loginuid, cap_eff, cap_prm, tty_major, tty_minor, level, has_exe = exe[:9]
            if has_exe:
                self._strs[tid] = {0: _cstr(data[body + EXEC_EXIT.size : off + size])}
                self._inos[tid] = list(exe[9:14])  # ino, ctime s/ns, mtime s/ns
            d += [sc, res, ppid, cap_eff, cap_prm, loginuid, tty_major, tty_minor, level]
        elif code == pg.REC_FORK:
            d.append(FORK.unpack_from(data, body)[0])
        elif code == pg.REC_EXIT:
            d.append(EXIT.unpack_from(data, body)[0])
        elif code == REC_ATTACHED:
            self.attached = True
            return None
        elif code == REC_LOST:
            self.stats.lost += LOST.unpack_from(data, body)[0]
            return None
        elif code == REC_TICK:
            self.tick = max(self.tick, TICK.unpack_from(data, body)[0])
            return None
        else:
            return None
        return self.record(d)
