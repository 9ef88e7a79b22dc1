"""The write-ahead log and the ledger of outputs against a reference model, on generated
sequences (Hypothesis ``RuleBasedStateMachine``).  Shared by ``test_model.py`` (a
bounded run in the suite) and ``benchmarks/storage_model.py`` (a longer profile).

Level
=====

The machine drives :class:`~ragtrace_collector.storage.service.Storage` itself, through
its public API (``start``, ``append``, ``settle``, ``pin``, ``unpin``, ``outputs_of``,
``replay``, ``hold_replayed``, ``replayed_marks``, ``forwarded``, ``close``, ``refusal``,
``set_exporters``, ``delivered``, ``settled``, ``room_for_output``) and the record kinds
of ``wal.py`` and ``outputs.py``, with ``outputs.Hold`` for holds.  The test plays the
pipeline's part as ``service/pipeline.py`` does it, and nothing more: a request is
handed to every exporter once its write is acknowledged; a hold (``pin``) keeps it
until its result is logged; a result is logged as an output record, written as
``Pipeline._append_output`` writes it (``timeout=False``, only when
``room_for_output`` says so, else tried again later; a failed write is tried again):
on a carrier (one group, delivered from the record; the hold ends once it is
written), or on the span (no groups; the copy is left out when
``room_for_output(needed=False)`` says no, and the trace goes on at once: the hold
ends when the copy is queued); a replay registers every record before asking for the
next chunk; replayed
requests and carriers go to the exporters that ``delivered`` does not name, once the
replay is over, and a request is judged again only when no result for it was replayed
and ``settled`` does not name it.  At this level every event the invariants speak of
("acknowledged", "delivered to exporter a", "judged", "settled") is one call the test
makes, so the model states them plainly, and each step can be run to quiescence: the
real :class:`Pipeline` adds an assembler whose releases are timed, which would make
the sequences depend on the clock.

The model (plain sets, kept apart from the storage): the acknowledged requests, what
each exporter has delivered, which results are logged, which records were damaged, and,
for the "clean restart" promise, what the storage could legitimately not know (after a
crash, a full disk or a damaged record, a duplicate is allowed; after a clean stop, it
is not).

Determinism
===========

Each generation of the log runs on one event loop whose clock the machine advances
(``wait``): the append timeout and the "held back" delay of settled marks are loop
time, so they fire when a rule says so, not when the machine is slow.  Disk faults go
through :class:`FileOps` (the existing seam of ``wal.py``; no production change): a
full disk (``ENOSPC``), a stalled disk (the writer blocks in ``writev`` until resumed,
then succeeds or fails).  After each rule every append's future is awaited (the
storage's own delivery marks included: they go through ``append``), so the checks see
a quiet log.  Syncs are not performed (the model decides what a crash keeps).

Crash: the log directory is copied as it is at that moment (what was written and
synced; the copy is the disk the next process sees) and, if a write is blocked on a
stalled disk, its first ``torn_bytes`` bytes are added to its file (a torn write).  The
old process is then stopped with its callbacks cut off from the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import struct
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ragtrace_collector.otlp.codec import SpanGroup
from ragtrace_collector.storage.config import StorageConfig
from ragtrace_collector.storage.fileops import FileOps
from ragtrace_collector.storage.outputs import (
    KIND_DELIVERED,
    KIND_OUTPUT,
    SETTLED_MARK,
    Hold,
    decode_output,
    encode_marks,
    encode_output,
)
from ragtrace_collector.storage.service import Storage, segment_size_for
from ragtrace_collector.storage.wal import (
    HEADER_SIZE,
    KIND_REQUEST,
    SEGMENT_HEADER_SIZE,
    Record,
    StorageError,
)

__all__ = ["CHECKS", "PROFILES", "LogMachine", "Profile", "machine_for"]

EXPORTERS = ("a", "b")
MAX_SIZE = 1024 * 1024
SEGMENT = segment_size_for(MAX_SIZE)
APPEND_TIMEOUT = 10.0

# The record format as ``wal.py`` documents it (a test-side reader and forger): after
# the segment header (magic, two copies of the segment's key), records of a header and
# an 8-byte tag keyed by the segment's key, then the payload.
_MAGIC_LEN = SEGMENT_HEADER_SIZE
_HEAD = struct.Struct("<4sBBHIQI")  # marker, kind, flags, reserved, length, seq, crc
_HEADER_SIZE = HEADER_SIZE
_MARK = b"\xa7\x5e\xd1\x0c"
_CHECKPOINT = struct.Struct("<QI")
_FIELDS = {"marker": 0, "kind": 4, "length": 8, "seq": 12, "payload": _HEADER_SIZE}
#: The request a result was computed for, in an output record's body (the model's
#: stand-in for the span a carrier links to, or the span a copy is).
_TARGET = struct.Struct("<Q")

#: The checks a profile can run.
CHECKS = ("checkpoint", "clean_restart", "delivered", "holds", "disk_bound")

T = TypeVar("T")


@dataclass(frozen=True)
class Profile:
    """Which invariants are checked and which faults are generated."""

    name: str
    checks: frozenset[str]
    clock: bool = True
    disk_full: bool = False
    stalls: bool = False
    damage: bool = False
    forgery: bool = False


_ALL_CHECKS = frozenset(CHECKS)
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("checkpoint", frozenset({"checkpoint"}), clock=False),
        Profile("clean_restart", frozenset({"clean_restart"})),
        Profile("holds", frozenset({"holds", "delivered"}), stalls=True),
        Profile("forgery", frozenset({"delivered"}), damage=True, forgery=True),
        Profile("disk_bound", frozenset({"disk_bound"}), disk_full=True),
        Profile(
            "everything",
            _ALL_CHECKS,
            disk_full=True,
            stalls=True,
            damage=True,
            forgery=True,
        ),
    )
}


class ModelViolation(AssertionError):
    """An invariant of the model does not hold."""


# ------------------------------------------------------------------ the machinery
class _VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock the machine moves forward (``wait``)."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = 0.0

    def time(self) -> float:
        return super().time() + self.offset


class _Disk(FileOps):
    """Injected I/O for one process: a full disk, a stalled one, a dead process."""

    def __init__(self) -> None:
        self.full = False
        self.stalled = False
        self.fail_stalled = False
        self.dead = False
        self._gate = threading.Event()
        self.entered = threading.Event()
        #: A write blocked on the stalled disk: (file path, bytes it was writing).
        self.blocked: tuple[str, bytes] | None = None

    def write(self, fd: int, data: memoryview) -> int:
        return self.writev(fd, [data])

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        if self.stalled and not self.dead:
            self.blocked = (os.readlink(f"/proc/self/fd/{fd}"), b"".join(buffers))
            self.entered.set()
            self._gate.wait(30.0)
            self.blocked = None
            if self.fail_stalled or self.dead:
                raise OSError(errno.ENOSPC, "No space left on device")
        if self.dead:
            raise OSError(errno.EIO, "the process is gone")
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().writev(fd, buffers)

    def resume(self, *, fail: bool) -> None:
        self.fail_stalled = fail
        self.stalled = False
        self.entered.clear()
        self._gate.set()
        self._gate = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if self.dead:
            raise OSError(errno.EIO, "the process is gone")

    def fsync(self, fd: int) -> None:
        self.fdatasync(fd)


class _Observed(Storage):
    """Storage, with every append's future kept, so that a step can await them all
    (the storage's own delivery marks go through :meth:`append` too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inflight: set[asyncio.Future[None]] = set()

    def append(self, payload: Any, **kwargs: Any) -> asyncio.Future[None]:
        future = super().append(payload, **kwargs)
        self.inflight.add(future)
        future.add_done_callback(self.inflight.discard)
        return future


def _no_forward(_trace: Any, _hold: Hold) -> None:
    raise AssertionError("the model logs results itself")


def _group(seq: int) -> SpanGroup:
    return SpanGroup(None, "", None, "", [], wal_seq=seq)


def _record_image(seq: int, kind: int, payload: bytes) -> bytes:
    """A complete record, as ``wal.py`` documents the format, with the tag a client
    can compute at best (it does not know the segment's key)."""
    head = _HEAD.pack(_MARK, kind, 0, 0, len(payload), seq, zlib.crc32(payload))
    return head + struct.pack("<Q", zlib.crc32(head)) + payload


def _records_in(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, seq, payload length) of the records of a segment, read by the documented
    format up to the first record that does not parse."""
    out: list[tuple[int, int, int]] = []
    offset = _MAGIC_LEN
    while offset + _HEADER_SIZE <= len(data):
        mark, _kind, _f, _r, length, seq, _crc = _HEAD.unpack_from(data, offset)
        if mark != _MARK or offset + _HEADER_SIZE + length > len(data):
            break
        out.append((offset, seq, length))
        offset += _HEADER_SIZE + length
    return out


def _segment_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.wal") if p.stem.isdigit())


def _disk_used(directory: Path) -> int:
    """Bytes of the segment files (one the writer deletes meanwhile counts nothing)."""
    used = 0
    for path in _segment_files(directory):
        with contextlib.suppress(FileNotFoundError):
            used += path.stat().st_size
    return used


def read_checkpoint(directory: Path) -> int:
    try:
        data = (directory / "checkpoint").read_bytes()
    except FileNotFoundError:
        return 0
    if len(data) != _CHECKPOINT.size:
        return 0
    seq, crc = _CHECKPOINT.unpack(data)
    return int(seq) if zlib.crc32(struct.pack("<Q", seq)) == crc else 0


@dataclass
class _Replay:
    """A replay in progress: the storage's iterator and what it has handed over."""

    chunks: Any  # the async iterator of Storage.replay()
    pending: list[Record] = field(default_factory=list)
    done: bool = False
    requests: list[int] = field(default_factory=list)
    carriers: list[tuple[int, int]] = field(default_factory=list)  # (carrier seq, source)
    results: set[int] = field(default_factory=set)  # sources with a replayed result
    early: set[int] = field(default_factory=set)  # sources judged before the end


@dataclass
class _Proc:
    """One collector process: its directory, disk, storage and the exporters' queues."""

    number: int
    directory: Path
    disk: _Disk
    storage: _Observed
    queues: dict[str, list[int]] = field(default_factory=lambda: {e: [] for e in EXPORTERS})
    #: Requests whose result is still to compute: source seq -> the hold on it (the
    #: evaluator's ``ledger.hold``; for a result written on the span, it stands for the
    #: processor holding the trace until it forwards it).
    judging: dict[int, Hold] = field(default_factory=dict)
    #: Results computed and being logged (their records not yet written).
    logging: set[int] = field(default_factory=set)
    retry: list[Callable[[], None]] = field(default_factory=list)
    replay: _Replay | None = None
    #: What was sent to each exporter by this process, and judged by it.
    sent: dict[str, set[int]] = field(default_factory=lambda: {e: set() for e in EXPORTERS})
    judged: set[int] = field(default_factory=set)
    #: A fault that may cost a duplicate happened in this process.
    lossy: bool = False
    closing: bool = False
    #: Records damaged while the log was closed (the replay must count them).
    flipped: int = 0
    #: The first sequence number a record of this process got (see ``_assigned``).
    first_seq: int | None = None


class LogMachine(RuleBasedStateMachine):
    """See the module docstring.  ``profile`` is set by :func:`machine_for`."""

    profile: ClassVar[Profile] = PROFILES["everything"]
    #: Sequences, steps, crashes (kill -9) and clean stops run (the benchmark's figures).
    runs: ClassVar[int] = 0
    steps: ClassVar[int] = 0
    crashes: ClassVar[int] = 0
    clean_stops: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.loop = _VirtualLoop()
        #: Exceptions that escaped a callback on the loop (the storage's own included):
        #: each is a bug, reported after the step.
        self.loop_errors: list[str] = []
        self.loop.set_exception_handler(self._loop_error)
        self.root = Path(tempfile.mkdtemp(prefix="ragtrace-model-"))
        self.proc: _Proc | None = None
        self.generation = 0
        self.directory = self.root / "g0"
        self.next_lossy = False  # the next start follows a crash or damage
        self.forgeries = 0
        self.flips: list[str] = []  # files with a record damaged since the last start
        #: The records of each damaged file (by name: a crash copies the directory) as
        #: it was before, and the bytes flipped; forgotten once the file is gone.
        self.parsed: dict[str, list[tuple[int, int, int]]] = {}
        self.flipped_at: set[tuple[str, int]] = set()
        self.failed = False
        # ---- the model
        self.acked: set[int] = set()  # acknowledged requests (seq)
        self.delivered: dict[str, set[int]] = {e: set() for e in EXPORTERS}
        self.carriers: dict[int, int] = {}  # logged carrier seq -> its source request
        self.judged: set[int] = set()  # requests with a logged result
        self.judge_calls: dict[int, int] = {}
        self.damaged: set[int] = set()  # seqs of records a flipped byte hit
        self.resend_ok: dict[str, set[int]] = {e: set() for e in EXPORTERS}
        self.rejudge_ok: set[int] = set()
        self.violations: list[str] = []
        self.retired = 0  # times sequence numbers were assigned again

    # ----------------------------------------------------------------- helpers
    def _run(self, awaitable: Awaitable[T]) -> T:
        async def wrap() -> T:
            return await awaitable

        return self.loop.run_until_complete(wrap())

    def _fail(self, what: str) -> None:
        self.failed = True
        raise ModelViolation(what)

    def _violation(self, what: str) -> None:
        self.violations.append(what)

    def _check(self, name: str) -> bool:
        return name in self.profile.checks

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def replaying(self) -> bool:
        return self.proc is not None and self.proc.replay is not None

    @property
    def stalled(self) -> bool:
        return self.proc is not None and self.proc.disk.stalled

    async def _quiesce(self) -> None:
        """Await every append in flight (none can finish while the disk is stalled),
        retry failed output writes, let the loop run the writer's callbacks."""
        proc = self.proc
        if proc is None:
            return
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            for _ in range(3):
                await asyncio.sleep(0)
            if proc.retry and not proc.disk.full and not proc.disk.stalled:
                todo, proc.retry = proc.retry, []
                for again in todo:
                    again()
            pending = [f for f in proc.storage.inflight if not f.done()]
            if not pending:
                await asyncio.sleep(0)
                if not any(not f.done() for f in proc.storage.inflight):
                    return
                continue
            if proc.disk.stalled:
                await asyncio.to_thread(proc.disk.entered.wait, 2.0)
                return
            await asyncio.wait(pending, timeout=1.0)
        storage = proc.storage
        raise AssertionError(
            "the log did not become quiet in 30 s: writes waiting "
            f"{sorted(storage._waiting)}, ops queued {storage._ops.qsize()}, writer alive "
            f"{storage._thread is not None and storage._thread.is_alive()}, disk full "
            f"{proc.disk.full} stalled {proc.disk.stalled}; loop errors {self.loop_errors}"
        )

    def _loop_error(self, _loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
        self.loop_errors.append(f"{context.get('message')}: {detail}")

    def _step(self, coro: Awaitable[None]) -> None:
        type(self).steps += 1
        self._run(coro)
        self._run(self._quiesce())
        if self.loop_errors:
            raise AssertionError(f"an exception escaped a loop callback: {self.loop_errors[0]}")

    # ----------------------------------------------------------------- process
    async def _start(self) -> None:
        if self.parsed:
            self.parsed = {n: r for n, r in self.parsed.items() if (self.directory / n).exists()}
            self.flipped_at = {f for f in self.flipped_at if f[0] in self.parsed}
        disk = _Disk()
        storage = _Observed(
            StorageConfig(
                directory=self.directory,
                max_size=MAX_SIZE,
                fsync="batch",
                append_timeout=APPEND_TIMEOUT,
            ),
            file_ops=disk,
        )
        storage.set_exporters(list(EXPORTERS))
        await storage.start()
        self.generation += 1
        proc = _Proc(self.generation, self.directory, disk, storage)
        self.proc = proc
        if self.next_lossy:
            # After a crash (or damage), anything delivered or judged before may come
            # again; what this process settles again is known from then on.
            for e in EXPORTERS:
                self.resend_ok[e] = set(self.delivered[e])
            self.rejudge_ok = set(self.judged)
            self.next_lossy = False
        proc.replay = _Replay(storage.replay().__aiter__())
        proc.flipped = sum(1 for name in set(self.flips) if (self.directory / name).exists())
        self.flips = []
        await self._replay(0)  # an empty log: the replay is over at once

    def _current(self, proc: _Proc) -> bool:
        return self.proc is proc

    def _send(self, proc: _Proc, seq: int, exporters: Iterable[str]) -> None:
        """Hand a request or carrier to exporters (their queues)."""
        for e in exporters:
            if seq in self.delivered[e] and seq not in self.resend_ok[e]:
                self._violation(f"exporter {e} is sent entry {seq} again after a clean restart")
            proc.queues[e].append(seq)
            proc.sent[e].add(seq)

    def _assigned(self, proc: _Proc, seq: int) -> None:
        """A record of this process got ``seq``.  The first one tells where this log
        starts numbering: past its checkpoint and the records on disk (``wal.py``).
        When the newest records were all deleted and a crash came before the
        checkpoint was written past them, numbers are assigned again; nothing on disk
        names the old ones (every record naming a number comes after it), so the
        model renames its old entries out of the way (to negative numbers: a renamed
        entry still needed is then past the checkpoint, and still owed at the end)."""
        if proc.first_seq is not None:
            return
        proc.first_seq = seq
        known = self.acked | set(self.carriers) | self.judged | self.damaged
        for e in EXPORTERS:
            known |= self.delivered[e]
        old = {s for s in known if s >= seq}
        if not old:
            return
        self.retired += 1
        base = self.retired * 1_000_000_000

        def ren(s: int) -> int:
            return -(base + s) if s in old else s

        def ren_set(values: set[int]) -> set[int]:
            return {ren(s) for s in values}

        self.acked = ren_set(self.acked)
        self.judged = ren_set(self.judged)
        self.damaged = ren_set(self.damaged)
        self.rejudge_ok = ren_set(self.rejudge_ok)
        self.carriers = {ren(c): ren(src) for c, src in self.carriers.items()}
        self.judge_calls = {ren(s): n for s, n in self.judge_calls.items()}
        for e in EXPORTERS:
            self.delivered[e] = ren_set(self.delivered[e])
            self.resend_ok[e] = ren_set(self.resend_ok[e])

    def _needs_judging(self, proc: _Proc, seq: int) -> None:
        if seq in self.judged and seq not in self.rejudge_ok:
            self._violation(f"request {seq} is judged again after a clean restart")
        self._take_hold(proc, seq)

    def _take_hold(self, proc: _Proc, seq: int) -> None:
        storage = proc.storage
        proc.judging[seq] = Hold(storage.pin([seq]), _no_forward, storage.unpin)

    # -------------------------------------------------------------- appending
    def _append_request(self, payload: bytes) -> None:
        proc = self.proc
        assert proc is not None
        storage = proc.storage
        if storage.refusal() is not None:
            return  # refused: the client retries later; nothing acknowledged
        seen: list[int] = []

        def tag(seq: int) -> int:
            self._assigned(proc, seq)
            seen.append(seq)
            return 1

        def admit() -> None:
            if self._current(proc):
                self._take_hold(proc, seen[0])
                self._send(proc, seen[0], EXPORTERS)

        def done(future: asyncio.Future[None]) -> None:
            if self._current(proc) and not future.cancelled() and future.exception() is None:
                self.acked.add(seen[0])

        try:
            future = storage.append(payload, tag=tag, admit=admit, kind=KIND_REQUEST)
        except StorageError:
            return
        future.add_done_callback(done)

    def _log_result(self, proc: _Proc, source: int, *, carrier: bool, size: int) -> None:
        """Log the result computed for ``source`` as the pipeline does.

        On a carrier (``Pipeline._log_output`` through the evaluator's hold): the hold
        counts the record being written, the evaluator releases the hold at once, and
        the record's write (admitted: delivered from the record) ends the hold.  On the
        span (``Pipeline._log_results``): a copy of the span, with no groups, left out
        when ``room_for_output(needed=False)`` says the log is at its bound; the
        processor forwards the trace right after queueing the copy (its hold ends
        then), and the result travels on the span.  Both go through
        :meth:`_append_output`.  The payload names ``source`` in its body, as a real
        record names its span (a carrier's link, a copy's span id): a replay finds the
        result by the span, not by the record's sources."""
        storage = proc.storage
        body = (b"C" if carrier else b"R") + _TARGET.pack(source) + b"r" * size
        hold = proc.judging.get(source)
        proc.logging.add(source)
        if carrier:
            sources = hold.sources if hold is not None else []
            box: list[int] = []

            def tag_carrier(seq: int) -> int:
                self._assigned(proc, seq)
                storage.outputs_of(seq, sources)
                box.append(seq)
                return 1

            def admit_carrier() -> None:
                if not self._current(proc):
                    return
                self._result_logged(proc, source)
                self.carriers[box[-1]] = source
                self._send(proc, box[-1], EXPORTERS)
                if hold is not None:
                    hold.logged()

            if hold is not None:
                hold.logging()
            self._append_output(proc, encode_output(sources, body), tag_carrier, admit_carrier)
            if hold is not None:
                proc.judging.pop(source, None)
                hold.release()  # the evaluator's job.release(), after the carrier is forwarded
            return
        # On the span (the pipeline's sources: the trace's entries).
        payload = encode_output([source], body)
        proc.judging.pop(source, None)
        # On the span, the result goes out with the trace.  Until its copy is written, a
        # replay may judge it again (no record says otherwise); left out at the bound,
        # it is never written.
        self.judged.add(source)
        self.rejudge_ok.add(source)
        if not storage.room_for_output(len(payload), needed=False):
            proc.logging.discard(source)
        else:

            def tag_copy(seq: int) -> int:
                self._assigned(proc, seq)
                storage.outputs_of(seq, [source])
                return 0

            def admit_copy() -> None:
                if self._current(proc):
                    self._result_logged(proc, source)

            self._append_output(proc, payload, tag_copy, admit_copy)
        if hold is not None:
            hold.release()  # the trace is forwarded

    def _result_logged(self, proc: _Proc, source: int) -> None:
        self.judged.add(source)
        self.rejudge_ok.discard(source)
        proc.logging.discard(source)

    def _append_output(
        self,
        proc: _Proc,
        payload: bytes,
        tag: Callable[[int], int],
        admit: Callable[[], None],
    ) -> None:
        """``Pipeline._append_output``: written when ``room_for_output`` (a needed
        record) says so, else tried again later; ``timeout=False`` (the future tells
        the write's outcome, however late); a failed write is tried again; a refused
        call (the log closed, the writer gone) gives up.  The pipeline's later tries
        run on a timer; here at the end of each step (:meth:`_quiesce`)."""
        storage = proc.storage

        def attempt() -> None:
            if not self._current(proc) or proc.closing:
                return
            if not storage.room_for_output(len(payload)):
                proc.retry.append(attempt)
                return
            try:
                future = storage.append(
                    payload, tag=tag, admit=admit, kind=KIND_OUTPUT, timeout=False
                )
            except StorageError:
                return

            def done(fut: asyncio.Future[None]) -> None:
                if fut.cancelled() or fut.exception() is None:
                    return
                if self._current(proc):
                    proc.retry.append(attempt)

            future.add_done_callback(done)

        attempt()

    # ------------------------------------------------------------------ rules
    @initialize()
    def start(self) -> None:
        self._step(self._start())

    # Preconditions read only what the rules themselves decide (running, stalled, the
    # profile), never what timing may change (a queue, the length of a replay), so that
    # Hypothesis draws the same rules when it runs a sequence again.
    @precondition(lambda self: self.running and not self.stalled)
    @rule(size=st.sampled_from([200, 120_000]))
    def append_request(self, size: int) -> None:
        """A client sends a request of ``size`` bytes (receivers listen once the replay
        is over: during a replay this does nothing)."""

        async def go() -> None:
            if not self.replaying:
                self._append_request(b"Q" + b"q" * size)

        self._step(go())

    @precondition(lambda self: self.profile.forgery and self.running and not self.stalled)
    @rule()
    def append_forged_request(self) -> None:
        """A request whose bytes hold a complete record image: a "settled" mark for
        every request acknowledged so far."""
        if not self.acked or self.replaying:
            return
        forged = _record_image(
            max(self.acked) + 1, KIND_DELIVERED, encode_marks({SETTLED_MARK: sorted(self.acked)})
        )
        self.forgeries += 1

        async def go() -> None:
            self._append_request(b"Q" + forged + b"q" * 64)

        self._step(go())

    @precondition(lambda self: self.running)
    @rule(exporter=st.sampled_from([*EXPORTERS, "both"]), pick=st.integers(0, 3))
    def deliver(self, exporter: str, pick: int) -> None:
        """``exporter`` (or both) delivers the entry at ``pick`` in its queue (any one:
        exporters finish out of order), and settles it."""
        proc = self.proc
        assert proc is not None
        chosen = list(EXPORTERS) if exporter == "both" else [exporter]
        first = proc.queues[chosen[0]]
        if not first:
            return
        seq = first[pick % len(first)]

        async def go() -> None:
            for e in chosen:
                if seq not in proc.queues[e]:
                    continue
                proc.queues[e].remove(seq)
                self.delivered[e].add(seq)
                self.resend_ok[e].discard(seq)
                proc.storage.settle([_group(seq)], EXPORTERS.index(e))

        self._step(go())

    @precondition(lambda self: self.running)
    @rule(
        pick=st.integers(0, 3),
        attach=st.sampled_from(["carrier", "span"]),
        size=st.sampled_from([100, 100_000]),
    )
    def judge(self, pick: int, attach: str, size: int) -> None:
        """Compute the result of one held request and log it (a carrier, or the span
        with its results); the hold ends once it is logged."""
        proc = self.proc
        assert proc is not None
        sources = sorted(s for s in proc.judging if s not in proc.logging)
        if not sources:
            return
        source = sources[pick % len(sources)]
        self.judge_calls[source] = self.judge_calls.get(source, 0) + 1
        proc.judged.add(source)

        async def go() -> None:
            self._log_result(proc, source, carrier=attach == "carrier", size=size)

        self._step(go())

    @precondition(lambda self: self.running)
    @rule(records=st.sampled_from([1, 1000]), judge_early=st.booleans())
    def replay(self, records: int, judge_early: bool) -> None:
        """Register the next ``records`` replayed records (the end of the replay hands
        replayed requests and carriers to the exporters).  ``judge_early``: then, if
        the replay is not over, the first replayed request with no logged result is
        judged and its result logged on a carrier while later records are still to
        be replayed (the evaluator works while replay goes on)."""

        async def go() -> None:
            if self.proc is None or self.proc.replay is None:
                return
            await self._replay(records)
            if judge_early:
                self._judge_early()

        self._step(go())

    def _judge_early(self) -> None:
        proc = self.proc
        assert proc is not None
        rp = proc.replay
        if rp is None:
            return
        todo = [
            s
            for s in rp.requests
            if s not in rp.results and s not in rp.early and s not in proc.storage.settled
        ]
        if not todo:
            return
        seq = todo[0]
        rp.early.add(seq)
        # Not checked as a repeated judgement: its logged result, if any, may come
        # later in the log; judging before the replay is over is this client's risk.
        self._take_hold(proc, seq)
        self.judge_calls[seq] = self.judge_calls.get(seq, 0) + 1
        proc.judged.add(seq)
        self._log_result(proc, seq, carrier=True, size=100)

    async def _replay(self, records: int) -> None:
        proc = self.proc
        assert proc is not None
        assert proc.replay is not None
        rp, storage = proc.replay, proc.storage
        for _ in range(records):
            if not rp.pending:
                try:
                    rp.pending = list(await rp.chunks.__anext__())
                except StopAsyncIteration:
                    self._replay_over(proc)
                    return
            record = rp.pending.pop(0)
            seq = record.seq
            if record.kind == KIND_REQUEST:
                storage.hold_replayed(seq, 1, to_forward=True)
                rp.requests.append(seq)
            elif record.kind == KIND_OUTPUT:
                try:
                    sources, body = decode_output(record.payload)
                except ValueError:
                    storage.hold_replayed(seq, 0)
                    continue
                (target,) = _TARGET.unpack_from(body, 1)
                if body.startswith(b"C"):
                    storage.hold_replayed(seq, 1, sources)
                    rp.carriers.append((seq, target))
                else:
                    storage.hold_replayed(seq, 0, sources)
                rp.results.add(target)
            elif record.kind == KIND_DELIVERED:
                storage.hold_replayed(seq, 0)
                storage.replayed_marks(record.payload)
            else:
                storage.hold_replayed(seq, 0)
        if not rp.pending:
            # Ask for the next chunk now, so the end is seen without another rule.
            try:
                rp.pending = list(await rp.chunks.__anext__())
            except StopAsyncIteration:
                self._replay_over(proc)

    def _replay_over(self, proc: _Proc) -> None:
        rp = proc.replay
        assert rp is not None
        proc.replay = None
        storage = proc.storage
        for seq in rp.requests:
            if seq in storage.settled:
                # Settled before the restart: neither sent nor judged (the pipeline's
                # dispatch drops it).
                storage.forwarded([_group(seq)])
                continue
            if seq not in rp.results and seq not in rp.early:
                self._needs_judging(proc, seq)  # the hold, before the trace is forwarded
            have = storage.delivered.get(seq, set())
            self._send(proc, seq, [e for i, e in enumerate(EXPORTERS) if i not in have])
            storage.forwarded([_group(seq)])
        for seq, _source in rp.carriers:
            have = storage.delivered.get(seq, set())
            self._send(proc, seq, [e for i, e in enumerate(EXPORTERS) if i not in have])
        # What this process did not send again, the storage knew was delivered.
        for e in EXPORTERS:
            self.resend_ok[e] &= proc.sent[e]
        if self._check("delivered") and proc.flipped and storage.skipped_records == 0:
            self._fail(f"{proc.flipped} damaged records, none counted as skipped")

    @precondition(lambda self: self.profile.clock)
    @rule(seconds=st.sampled_from([0.5, 1.5, 11.0]))
    def wait(self, seconds: float) -> None:
        """Loop time passes (the append timeout, the delay of settled marks)."""
        self.loop.offset += seconds
        self._step(asyncio.sleep(0))

    @precondition(lambda self: self.running)
    @rule(
        how=st.sampled_from(["clean", "kill", "kill_torn"]),
        replay=st.sampled_from(["all", "stepwise"]),
    )
    def restart(self, how: str, replay: str) -> None:
        """Stop the collector and start it again.  ``clean``: SIGTERM (a stalled disk
        answers first); what is being written is written, and the checkpoint and the
        delivery marks of the last round.  ``kill``: kill -9; the disk keeps what was
        written.  ``kill_torn``: kill -9 while a write is blocked on a stalled disk,
        whose first 20 bytes land (a torn write).  ``replay``: ``all`` replays the
        log to its end within this step; ``stepwise`` leaves it to ``replay``."""
        proc = self.proc
        assert proc is not None
        if how == "clean":
            self._close(proc)
        else:
            self._crash(proc, 20 if how == "kill_torn" else 0)
        self._step(self._start())
        if replay == "all" and self.proc is not None and self.proc.replay is not None:
            self._run(self._replay(1_000_000))
            self._run(self._quiesce())

    def _crash(self, proc: _Proc, torn_bytes: int) -> None:
        type(self).crashes += 1
        self.generation += 1
        new = self.root / f"g{self.generation}"
        new.mkdir()
        blocked = proc.disk.blocked
        for path in proc.directory.iterdir():
            if path.name in ("lock", "probe.tmp", "checkpoint.tmp"):
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            if blocked is not None and blocked[0] == os.path.realpath(path) and torn_bytes:
                data += blocked[1][:torn_bytes]
            (new / path.name).write_bytes(data)
        self.proc = None
        self._stop(proc, crash=True)
        self.directory = new
        self.next_lossy = True

    def _close(self, proc: _Proc) -> None:
        type(self).clean_stops += 1
        if proc.disk.stalled:
            proc.disk.resume(fail=False)
            self._run(self._quiesce())
        self._stop(proc, crash=False)
        if proc.lossy:
            self.next_lossy = True
        self.proc = None

    def _stop(self, proc: _Proc, *, crash: bool) -> None:
        proc.closing = True
        if crash:
            proc.disk.dead = True
            proc.disk.resume(fail=True)
        if proc.replay is not None:
            self._run(proc.replay.chunks.aclose())
        self._run(proc.storage.close())
        if crash:
            shutil.rmtree(proc.directory, ignore_errors=True)

    @precondition(lambda self: self.profile.disk_full and self.running and not self.stalled)
    @rule(full=st.booleans())
    def disk(self, full: bool) -> None:
        """The disk fills up (writes fail with ENOSPC) or has room again."""
        proc = self.proc
        assert proc is not None
        if full:
            proc.lossy = True  # delivery marks may be lost: duplicates allowed
        proc.disk.full = full
        self._step(self._writable_again(proc) if not full else asyncio.sleep(0))

    async def _writable_again(self, proc: _Proc) -> None:
        """After a failed write the writer probes the disk every half second: wait
        (bounded) for that, so that the next step does not depend on the clock."""
        for _ in range(300):
            refusal = proc.storage.refusal()
            if refusal is None or refusal[0] != "storage_error":
                return
            await asyncio.sleep(0.01)

    @precondition(lambda self: self.profile.stalls and self.running and not self.stalled)
    @rule()
    def disk_stalls(self) -> None:
        """The disk stops answering: the next write blocks until ``disk_resumes``."""
        proc = self.proc
        assert proc is not None
        proc.disk.stalled = True
        proc.lossy = True
        self._step(asyncio.sleep(0))

    @precondition(lambda self: self.stalled)
    @rule(fails=st.booleans())
    def disk_resumes(self, fails: bool) -> None:
        """The blocked write completes, or fails (ENOSPC)."""
        proc = self.proc
        assert proc is not None
        proc.disk.resume(fail=fails)
        self._step(self._writable_again(proc))

    @precondition(lambda self: self.profile.damage and self.running)
    @rule(
        segment=st.integers(0, 7),
        record=st.integers(0, 15),
        where=st.sampled_from(sorted(_FIELDS)),
    )
    def flip_byte(self, segment: int, record: int, where: str) -> None:
        """A byte of a record of a closed segment goes bad (any segment but the newest,
        which may be the one being written; the next start reads the damage).  Records
        are found as the file was before any damage (a damaged length would misplace
        the next ones), and a byte already flipped is left alone (flipping it again
        would mend the record)."""
        files = _segment_files(self.directory)[:-1]
        if not files:
            return
        path = files[segment % len(files)]
        try:
            with open(path, "r+b") as fh:  # not re-created if the writer deletes it
                data = fh.read()
                records = self.parsed.setdefault(path.name, _records_in(data))
                if not records:
                    return
                offset, seq, length = records[record % len(records)]
                if where == "payload" and length == 0:
                    where = "seq"
                at = offset + _FIELDS[where]
                if (path.name, at) in self.flipped_at:
                    return
                self.flipped_at.add((path.name, at))
                fh.seek(at)
                fh.write(bytes([data[at] ^ 0x40]))
        except FileNotFoundError:
            return
        self.damaged.add(seq)
        self.flips.append(path.name)
        self.next_lossy = True
        type(self).steps += 1

    # ------------------------------------------------------------- invariants
    def _needed(self) -> set[int]:
        """Records the next start still needs: acknowledged requests not delivered
        everywhere or not judged, and logged carriers not delivered everywhere."""
        needed: set[int] = set()
        for seq in self.acked:
            if not all(seq in self.delivered[e] for e in EXPORTERS) or seq not in self.judged:
                needed.add(seq)
        for seq in self.carriers:
            if not all(seq in self.delivered[e] for e in EXPORTERS):
                needed.add(seq)
        return needed - self.damaged

    def _check_checkpoint(self, directory: Path) -> None:
        if not self._check("checkpoint"):
            return
        checkpoint = read_checkpoint(directory)
        passed = sorted(s for s in self._needed() if s < checkpoint)
        if passed:
            self._fail(f"checkpoint {checkpoint} passes entries still needed: {passed}")

    def check_all_invariants(self) -> None:
        """Every invariant (for sequences played by hand)."""
        self.checkpoint_never_passes_an_unsettled_entry()
        self.no_resend_nor_rejudge_after_a_clean_restart()
        self.disk_within_bound()

    @invariant()
    def checkpoint_never_passes_an_unsettled_entry(self) -> None:
        self._check_checkpoint(self.directory)

    @invariant()
    def no_resend_nor_rejudge_after_a_clean_restart(self) -> None:
        if self._check("clean_restart") and self.violations:
            self._fail("; ".join(self.violations))

    @invariant()
    def disk_within_bound(self) -> None:
        if not self._check("disk_bound") or self.failed:
            return
        bound = MAX_SIZE + SEGMENT
        used = 0
        for _ in range(50):  # deletions run on the writer thread: give them a moment
            used = _disk_used(self.directory)
            if used <= bound:
                return
            self._run(asyncio.sleep(0.01))
        self._fail(f"the log uses {used} bytes on disk; the bound is {bound}")

    # -------------------------------------------------------------- the end
    def _drain(self) -> None:
        """The final replay: faults cleared, the log reopened and replayed, every
        exporter delivers everything, every held request is judged."""
        if self.proc is not None and self.proc.disk.stalled:
            self.proc.disk.resume(fail=False)
            self._run(self._quiesce())
        if self.proc is not None:
            self.proc.disk.full = False
        if self.proc is None:
            self._run(self._start())
        proc = self.proc
        assert proc is not None
        for _ in range(200):
            self._run(self._quiesce())
            if proc.replay is not None:
                self._run(self._replay(1000))
                continue
            busy = False
            for source in sorted(set(proc.judging) - proc.logging):
                busy = True
                proc.judged.add(source)
                self._log_result(proc, source, carrier=True, size=10)
            for e in EXPORTERS:
                while proc.queues[e]:
                    busy = True
                    seq = proc.queues[e].pop(0)
                    self.delivered[e].add(seq)
                    proc.storage.settle([_group(seq)], EXPORTERS.index(e))
            if not busy and not proc.retry:
                self._run(self._quiesce())
                if not any(proc.queues.values()) and not (set(proc.judging) - proc.logging):
                    break
        if self._check("holds") and proc.logging:
            self._fail(
                f"results computed for {sorted(proc.logging)} are never logged: "
                "their holds never end"
            )
        if self._check("delivered"):
            lost = {e: sorted(self.acked - self.damaged - self.delivered[e]) for e in EXPORTERS}
            if any(lost.values()):
                self._fail(f"acknowledged requests never delivered: {lost}")
            carriers = {
                e: sorted(set(self.carriers) - self.damaged - self.delivered[e]) for e in EXPORTERS
            }
            if any(carriers.values()):
                self._fail(f"logged results never delivered: {carriers}")

    def teardown(self) -> None:
        try:
            if self.profile.checks & {"delivered", "holds"} and not self.failed:
                self._drain()
        finally:
            proc, self.proc = self.proc, None
            try:
                if proc is not None:
                    if proc.disk.stalled:
                        proc.disk.resume(fail=True)
                    self._stop(proc, crash=False)
            finally:
                self.loop.run_until_complete(self.loop.shutdown_default_executor())
                self.loop.close()
                shutil.rmtree(self.root, ignore_errors=True)


def machine_for(profile: str) -> type[LogMachine]:
    """A machine class that checks ``profile`` (see :data:`PROFILES`)."""
    chosen = PROFILES[profile]
    return type(f"LogMachine_{profile}", (LogMachine,), {"profile": chosen})
