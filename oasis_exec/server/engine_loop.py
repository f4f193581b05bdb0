"""The engine runs in a thread of its own; HTTP handlers talk to it through queues.

    handler --submit()--> command queue --> engine thread: add/abort, step(), publish stats
    handler <-- asyncio.Queue per request <-- loop.call_soon_threadsafe(deliver, batch of events)

New requests join the running batch between two steps (continuous batching); admission by GPU and host memory
is the engine's business. The server bounds only the requests that are accepted but not running: past
`max_waiting` a submission raises `QueueFull` at once (the handler answers 429), so nothing ever hangs.

Every accepted request ends with exactly one terminal event: a finish reason, `"abort"`, or an error. If a step
raises, every request in flight gets an error event and is aborted in the engine, and the loop carries on.

Health (`health()`, `/health`): unhealthy from a failed step until the engine is shown healthy again -- by a step
that succeeds, or, while idle, by the engine's optional `check()` -- and stalled while requests are in flight but
the engine thread has made no progress (a step, an add, or an idle wait ending) for `stall_timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from .engine_protocol import EngineStats, Sampling, ServingEngine, StepOutput, TokenLogprobs

log = logging.getLogger("oasis_exec.server")

_IDLE_POLL_S = 0.5


class QueueFull(Exception):
    """The waiting queue holds `max_waiting` requests already."""


class Rejected(Exception):
    """The engine refused a request at `add_request` (status 400 for ValueError, else 500)."""

    def __init__(self, status: int, message: str, code: str = "engine_rejected") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


@dataclass(frozen=True)
class Event:
    """One delivery to a request: new tokens, and whether (and why) it ended."""

    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"
    error: str | None = None
    logprobs: tuple[TokenLogprobs, ...] | None = None  # one a token, when the request asked for them
    error_code: str = "engine_error"  # with finish_reason "error": "engine_error" | "server_shutting_down"

    @property
    def terminal(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestStream:
    """Server-side view of one request; lives in the event loop thread."""

    id: int
    prompt_len: int
    arrival: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    accepted: asyncio.Future | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    n_tokens: int = 0
    finished: bool = False
    # With stop strings the reader (generation.text_pieces) decides a stop: an end by length is counted once it has
    # read the last tokens (`EngineLoop.abort`, which it calls when it is done), as "stop" where they complete a
    # stop string. length_end_at: the time of an end by length not yet counted.
    stops: bool = False
    stop_seen: bool = False
    reader_done: bool = False
    length_end_at: float | None = None


@dataclass(frozen=True)
class _Add:
    sid: int
    prompt_ids: tuple[int, ...]
    sampling: Sampling


@dataclass(frozen=True)
class _Abort:
    sid: int
    reason: str


@dataclass(frozen=True)
class _Call:
    fn: Callable[[], Any]
    done: Callable[[BaseException | None, Any], None]


_STOP = object()


class EngineLoop:
    def __init__(
        self,
        engine: ServingEngine,
        *,
        max_waiting: int,
        metrics=None,
        served=None,
        stall_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: the seconds the stall rule reads (the engine thread's last sign of life against now); tests
        drive it by hand."""
        self.engine = engine
        self.clock = clock
        self.max_waiting = max_waiting
        self.stall_timeout_s = stall_timeout_s
        self.metrics = metrics
        self.served = served  # record.ServeLog of `serve --record`, or None
        self._cmds: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[int, RequestStream] = {}  # event loop thread only
        self._calls: set[asyncio.Future] = set()  # `call`s in flight (prompt scoring): drained as streams are
        self._preparing = 0  # requests being parsed and tokenised (`prepare`): drained too
        self._next_sid = 0
        self._lock = threading.Lock()
        self._handoff = 0  # submitted, not yet added to the engine
        self._stats = EngineStats()
        self._draining = False  # shutting down: no new requests
        self._failure: str | None = None  # why the last step failed, until the engine is healthy again
        self._progress_at = clock()  # the engine thread's last sign of life
        # engine thread only:
        self._live: dict[int, Hashable] = {}
        self._sid_of: dict[Hashable, int] = {}

    # ---- event loop side ----

    def start(self) -> None:
        self._aloop = asyncio.get_running_loop()
        if self.served is not None:
            self.served.start()
        self._thread = threading.Thread(target=self._run, name="oasis-engine", daemon=True)
        self._thread.start()

    async def drain(self, grace_s: float) -> None:
        """Shutting down: refuse new requests, let those in flight run for up to `grace_s`, then end every one
        still running with an explicit error (`error_code` "server_shutting_down") and free it in the engine."""
        self._draining = True
        deadline = time.monotonic() + grace_s
        while (self._streams or self._calls or self._preparing) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self._streams or self._calls:
            log.warning(
                "shutting down: ending %d requests still running after the %g s grace period",
                len(self._streams) + len(self._calls),
                grace_s,
            )
        why = f"server shutting down: the request did not finish within the {grace_s:g} s grace period"
        for fut in list(self._calls):  # its engine call may still run; its answer is no longer awaited
            if not fut.done():
                fut.set_exception(Rejected(503, why, "server_shutting_down"))
        for stream in list(self._streams.values()):
            self.abort(stream)
            self._deliver_one(
                stream.id,
                Event(
                    finish_reason="error",
                    error_code="server_shutting_down",
                    error=why,
                ),
            )

    async def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread is None:
            return
        self._draining = True
        self._cmds.put(_STOP)
        await asyncio.to_thread(self._thread.join, timeout_s)
        self._thread = None
        for stream in list(self._streams.values()):  # anything the thread did not finish
            self._deliver_one(
                stream.id, Event(finish_reason="error", error="server shutting down", error_code="server_shutting_down")
            )
        for fut in list(self._calls):
            if not fut.done():
                fut.set_exception(Rejected(503, "server shutting down", "server_shutting_down"))

    async def prepare(self, fn: Callable[[], Any]) -> Any:
        """Run a request's parsing and tokenising ``fn`` in a worker thread, counted among the requests in flight
        (a shutdown's grace period waits for it; what it submits afterwards gets the shutdown's 503)."""
        self._preparing += 1
        try:
            return await asyncio.to_thread(fn)
        finally:
            self._preparing -= 1

    def snapshot(self) -> tuple[EngineStats, int, bool]:
        stats, handoff = self._stats, self._handoff
        return stats, handoff, self.health()[0] == "ok"

    def health(self) -> tuple[str, str | None]:
        """("ok", None), or ("unhealthy" | "stalled", why)."""
        if self._thread is None:
            return "unhealthy", "the engine thread is not running"
        with self._lock:
            failure, idle_s, handoff = self._failure, self.clock() - self._progress_at, self._handoff
        if failure is not None:
            return "unhealthy", failure
        if idle_s > self.stall_timeout_s and (handoff or self._streams):
            return "stalled", (
                f"no engine progress for {idle_s:.1f} s while {len(self._streams)} requests are in "
                f"flight (stall timeout {self.stall_timeout_s:g} s)"
            )
        return "ok", None

    def num_waiting(self) -> int:
        stats, handoff, _ = self.snapshot()
        return stats.waiting + handoff

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    async def submit(self, prompt_ids: Sequence[int], sampling: Sampling, stops: bool = False) -> RequestStream:
        """Queue a request; return once the engine has accepted it. Raises QueueFull or Rejected. ``stops``: the
        reader matches stop strings (its end by length is counted once the reader says, ``abort``)."""
        if self._thread is None:
            raise Rejected(503, "the engine is not running")
        if self._draining:
            raise Rejected(503, "server shutting down: no new requests", "server_shutting_down")
        with self._lock:
            if self._stats.waiting + self._handoff >= self.max_waiting:
                raise QueueFull(f"{self._stats.waiting + self._handoff} requests are waiting (max {self.max_waiting})")
            self._handoff += 1
        sid = self._next_sid
        self._next_sid += 1
        stream = RequestStream(id=sid, prompt_len=len(prompt_ids), arrival=time.monotonic(), stops=stops)
        stream.accepted = asyncio.get_running_loop().create_future()
        self._streams[sid] = stream
        self._cmds.put(_Add(sid, tuple(int(t) for t in prompt_ids), sampling))
        try:
            await asyncio.shield(stream.accepted)
        except asyncio.CancelledError:
            self.abort(stream)
            raise
        return stream

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn()` on the engine thread between two steps (the only thread that may touch the engine); return
        its result or raise its exception."""
        if self._thread is None:
            raise Rejected(503, "the engine is not running")
        if self._draining:
            raise Rejected(503, "server shutting down: no new requests", "server_shutting_down")
        aloop = asyncio.get_running_loop()
        fut = aloop.create_future()
        self._calls.add(fut)
        fut.add_done_callback(self._calls.discard)

        def done(exc: BaseException | None, result: Any) -> None:  # engine thread
            def settle() -> None:
                if not fut.done():
                    fut.set_exception(exc) if exc is not None else fut.set_result(result)

            try:
                aloop.call_soon_threadsafe(settle)
            except RuntimeError:  # the event loop is closed: shutting down
                pass

        self._cmds.put(_Call(fn, done))
        return await fut

    def abort(self, stream: RequestStream, reason: str = "abort") -> None:
        """End a request early: `"abort"` when the client went away, `"stop"` on a stop string. Once it has
        finished, only its pending end by length is settled: as "stop" when the reader's stop string was completed by
        its last tokens, else as "length" (the reader calls this when it is done)."""
        stream.stop_seen |= reason == "stop"
        stream.reader_done = True
        if not stream.finished:
            self._cmds.put(_Abort(stream.id, reason))  # (the engine thread ignores a second one)
        elif stream.length_end_at is not None:
            at, stream.length_end_at = stream.length_end_at, None
            self._end(stream, "stop" if stream.stop_seen else "length", at)

    def _post(self, batch: list[tuple[int, Event | Rejected | None]]) -> None:
        """Engine thread -> event loop."""
        if not batch or self._aloop is None:
            return
        try:
            self._aloop.call_soon_threadsafe(self._deliver, batch)
        except RuntimeError:  # the event loop is closed: shutting down
            pass

    def _deliver(self, batch: list[tuple[int, Event | Rejected | None]]) -> None:
        for sid, item in batch:
            stream = self._streams.get(sid)
            if stream is None:
                continue
            if item is None or isinstance(item, Rejected):  # the answer to an add
                if stream.accepted is not None and not stream.accepted.done():
                    if item is None:
                        stream.accepted.set_result(True)
                    else:
                        stream.accepted.set_exception(item)
                        stream.finished = True
                        self._streams.pop(sid, None)
                continue
            self._deliver_one(sid, item)

    def _deliver_one(self, sid: int, ev: Event) -> None:
        stream = self._streams.get(sid)
        if stream is None:
            return
        now = time.monotonic()
        if ev.token_ids:
            if stream.first_token_at is None:
                stream.first_token_at = now
                if self.metrics:
                    self.metrics.ttft.observe(now - stream.arrival)
            stream.last_token_at = now
            stream.n_tokens += len(ev.token_ids)
            if self.metrics:
                self.metrics.on_tokens(len(ev.token_ids))
        if ev.terminal:
            stream.finished = True
            self._streams.pop(sid, None)
            if stream.accepted is not None and not stream.accepted.done():
                stream.accepted.set_exception(Rejected(503, ev.error or "request ended before it was accepted"))
            reason = "stop" if ev.finish_reason == "length" and stream.stop_seen else ev.finish_reason
            if stream.stops and reason == "length" and not stream.reader_done:  # a stop string may end these tokens
                stream.length_end_at = now
            else:
                self._end(stream, reason, now)
        stream.queue.put_nowait(ev)

    def _end(self, stream: RequestStream, reason: str, now: float) -> None:
        """A finished request's record and metrics, by the outcome its client saw."""
        if self.served is not None:
            self.served.on_end(stream, reason, now)
        if self.metrics:
            self.metrics.requests.labels(reason).inc()
            if stream.first_token_at is not None and reason in ("length", "stop"):
                self.metrics.e2e.observe(now - stream.arrival)
                if stream.n_tokens > 1:
                    self.metrics.tpot.observe((now - stream.first_token_at) / (stream.n_tokens - 1))

    # ---- engine thread ----

    def _run(self) -> None:
        eng = self.engine
        while True:
            batch: list[tuple[int, Event | Rejected | None]] = []
            cmds = self._drain(block=not self._busy())
            if _STOP in cmds:
                for cmd in cmds:
                    if isinstance(cmd, _Call):
                        cmd.done(Rejected(503, "server shutting down", "server_shutting_down"), None)
                self._shutdown()
                return
            for cmd in cmds:
                self._apply(cmd, batch)
            if cmds or not self._busy():
                self._publish()
            self._post(batch)
            batch = []
            self._alive()
            if not self._busy():
                self._probe()
                continue
            t_step = time.perf_counter()
            try:
                outs = eng.step()
            except Exception as exc:  # the engine failed: end every request in flight explicitly
                log.exception("engine step failed")
                self._fail_all(f"engine step failed: {type(exc).__name__}: {exc}", batch)
                with self._lock:
                    self._failure = f"the last engine step failed: {type(exc).__name__}: {exc}"
            else:
                self._collect(outs, batch)
                with self._lock:
                    self._failure = None
            self._alive()
            self._publish()  # the waiting count gates admission: keep it exact
            if self.served is not None:
                self.served.on_step(time.perf_counter() - t_step, self._stats.running)
            self._post(batch)

    def _alive(self) -> None:
        with self._lock:
            self._progress_at = self.clock()

    def _probe(self) -> None:
        """Idle after a failed step: ask the engine whether it can serve again."""
        check = getattr(self.engine, "check", None)
        if self._failure is None or not callable(check):
            return
        try:
            check()
        except Exception as exc:
            log.warning("engine still unhealthy: %s: %s", type(exc).__name__, exc)
            return
        with self._lock:
            self._failure = None
        log.warning("engine healthy again")

    def _drain(self, block: bool) -> list:
        cmds = []
        if block:
            try:
                cmds.append(self._cmds.get(timeout=_IDLE_POLL_S))
            except queue.Empty:
                return cmds
        while True:
            try:
                cmds.append(self._cmds.get_nowait())
            except queue.Empty:
                return cmds

    def _apply(self, cmd, batch: list) -> None:
        if isinstance(cmd, _Add):
            try:
                eid = self.engine.add_request(list(cmd.prompt_ids), cmd.sampling)
            except ValueError as exc:
                batch.append((cmd.sid, Rejected(400, str(exc))))
            except Exception as exc:
                log.exception("engine add_request failed")
                batch.append((cmd.sid, Rejected(500, f"engine add_request failed: {type(exc).__name__}: {exc}")))
            else:
                self._live[cmd.sid] = eid
                self._sid_of[eid] = cmd.sid
                batch.append((cmd.sid, None))
            with self._lock:
                self._handoff -= 1
        elif isinstance(cmd, _Call):
            try:
                result = cmd.fn()
            except Exception as exc:
                cmd.done(exc, None)
            else:
                cmd.done(None, result)
        elif isinstance(cmd, _Abort):
            eid = self._live.pop(cmd.sid, None)
            if eid is None:
                return
            del self._sid_of[eid]
            try:
                self.engine.abort(eid)
            except Exception:
                log.exception("engine abort failed")
            batch.append((cmd.sid, Event(finish_reason=cmd.reason)))

    def _collect(self, outs: list[StepOutput], batch: list) -> None:
        for out in outs:
            sid = self._sid_of.get(out.request_id)
            if sid is None:
                continue  # aborted meanwhile
            if out.finish_reason is not None:
                del self._sid_of[out.request_id]
                del self._live[sid]
            batch.append((sid, Event(tuple(out.new_token_ids), out.finish_reason, logprobs=out.logprobs)))

    def _fail_all(self, message: str, batch: list) -> None:
        code = "server_shutting_down" if message == "server shutting down" else "engine_error"
        for sid, eid in list(self._live.items()):
            try:
                self.engine.abort(eid)
            except Exception:
                log.exception("engine abort failed")
            batch.append((sid, Event(finish_reason="error", error=message, error_code=code)))
        self._live.clear()
        self._sid_of.clear()

    def _busy(self) -> bool:
        try:
            return self.engine.has_unfinished()
        except Exception:
            log.exception("engine has_unfinished() failed")
            return False

    def _publish(self) -> None:
        try:
            stats = self.engine.stats()
        except Exception:
            log.exception("engine stats failed")
            return
        with self._lock:
            self._stats = stats

    def _shutdown(self) -> None:
        batch: list = []
        self._fail_all("server shutting down", batch)
        self._publish()
        self._post(batch)
