"""One engine, one device: a thread that serves jobs one at a time, in arrival order, from a bounded queue.

The engine is only ever touched by this thread. A job starts a generation (``start(engine)``
returns the engine's event iterator) and the worker hands each event to the request's
coroutine through ``deliver`` (thread-safe). Cancelling a job (its client went away, or the
server stops) takes effect at the next step: the worker closes the iterator, which rewinds
the KV caches to what was committed (``Engine`` does that in a ``finally``), so the next
request finds the engine consistent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from edge_spec.errors import EdgeSpecError
from edge_spec.runtime.config import Stats, StreamEvent
from edge_spec.serve.errors import APIError

log = logging.getLogger("edge_spec.serve")


@dataclass(frozen=True)
class Started:
    """The generation began: the prompt is accepted (``info``: e.g. how many old messages were dropped)."""

    info: dict[str, Any]


@dataclass(frozen=True)
class Finished:
    stats: Stats
    cancelled: bool = False


@dataclass(frozen=True)
class Failed:
    error: APIError


Start = Callable[[Any], tuple[Iterator[StreamEvent], dict[str, Any]]]


@dataclass(eq=False)
class Job:
    """One request's generation. ``deliver`` receives Started, then StreamEvents, then Finished (or Failed)."""

    start: Start
    deliver: Callable[[object], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


class QueueFull(Exception):
    """No room: more requests wait than the queue holds (or the server is stopping); ``retry_after`` in seconds."""

    def __init__(self, retry_after: int, closing: bool = False) -> None:
        super().__init__(retry_after)
        self.retry_after, self.closing = retry_after, closing


class Worker:
    """Serves jobs one at a time in arrival order; at most ``queue_size`` jobs wait behind the running one."""

    def __init__(self, engine: Any, queue_size: int) -> None:
        self.engine, self.queue_size = engine, queue_size
        self._waiting: deque[Job] = deque()
        self._cv = threading.Condition()
        self._running: Job | None = None
        self._accepting = True  # False once the server stops: new jobs are refused, queued ones still served
        self._stopping = False  # the thread ends
        self._mean_seconds = 1.0  # moving average of a job's time, for Retry-After
        self.counts = {"served": 0, "cancelled": 0, "failed": 0, "rejected": 0}
        self._thread = threading.Thread(target=self._loop, name="edge-spec-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``, or raise :class:`QueueFull` when ``queue_size`` jobs already wait (or the server stops)."""
        with self._cv:
            ahead = len(self._waiting) + (self._running is not None)  # jobs this one would wait for
            if not self._accepting or ahead > self.queue_size:
                self.counts["rejected"] += 1
                raise QueueFull(max(1, min(60, round(self._mean_seconds * ahead))), closing=not self._accepting)
            self._waiting.append(job)
            self._cv.notify_all()

    def cancel(self, job: Job) -> None:
        """Stop ``job``: dropped if still waiting, else stopped at its next step. Safe to call when it is done."""
        job.cancelled.set()
        with self._cv:
            try:
                self._waiting.remove(job)
            except ValueError:
                return
            self.counts["cancelled"] += 1
            self._cv.notify_all()

    def drain(self, timeout: float) -> None:
        """Refuse new jobs; give the running and waiting ones ``timeout`` seconds, then cancel what is left (the
        running one at its next step: its client still gets a proper end; the waiting ones get 503)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._accepting = False
            while (self._running is not None or self._waiting) and deadline > time.monotonic():
                self._cv.wait(deadline - time.monotonic())
            waiting, self._waiting = list(self._waiting), deque()
            if self._running is not None:
                self._running.cancelled.set()
            self.counts["cancelled"] += len(waiting)
        for job in waiting:
            job.cancelled.set()
            job.deliver(Failed(APIError(503, "The server is shutting down; the request was not started.",
                                        type="server_error", code="server_shutting_down")))

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel what is left (see :meth:`drain`), then end the thread."""
        self.drain(0)
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def status(self) -> dict[str, Any]:
        with self._cv:
            return {"running": self._running is not None, "waiting": len(self._waiting),
                    "queue_size": self.queue_size, **self.counts}

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                job = self._running = self._waiting.popleft()
            t0 = time.perf_counter()
            outcome = self._run(job)
            with self._cv:
                self._running = None
                self.counts[outcome] += 1
                self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.perf_counter() - t0)
                self._cv.notify_all()  # drain() waits for this

    def _run(self, job: Job) -> str:
        """Serve one job; returns 'served', 'cancelled' or 'failed'. Never raises: a bug fails one request only."""
        if job.cancelled.is_set():  # its client left just as it was taken from the queue
            return "cancelled"
        try:
            try:
                events, info = job.start(self.engine)
            except APIError as exc:
                job.deliver(Failed(exc))
                return "failed"
            except EdgeSpecError as exc:  # e.g. a role order the chat template forbids: the request's fault
                job.deliver(Failed(APIError(400, str(exc), code="invalid_value")))
                return "failed"
            job.deliver(Started(info))
            cancelled = False
            try:
                for event in events:
                    if job.cancelled.is_set():
                        cancelled = True
                        break
                    job.deliver(event)
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()  # the engine's finally: KV rewound to the committed tokens
            job.deliver(Finished(self.engine.last_stats, cancelled))
            return "cancelled" if cancelled else "served"
        except Exception:
            log.exception("generation failed")
            job.deliver(Failed(APIError(500, "The server failed while generating this reply (see the server log); "
                                             "the next request is served normally.", type="server_error",
                                        code="internal_error")))
            return "failed"
