"""Run the app with uvicorn on a socket we bind ourselves, and stop gracefully on SIGINT / SIGTERM.

Binding here (rather than inside uvicorn) turns "port in use" into one sentence, tells the
caller the real port when 0 asked for a free one, and says whether the address is loopback.
uvicorn finishes the requests in flight (cancelling them after ``grace`` seconds), the app's
lifespan then stops the engine's worker, and :func:`serve` returns the signal's name: a stop
asked for by a signal is a normal exit, not a crash.
"""

from __future__ import annotations

import errno
import ipaddress
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from edge_spec.errors import EdgeSpecError

GRACE_SECONDS = 5.0  # requests still running this long after SIGINT/SIGTERM are cancelled (at their next step)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one), or one sentence saying why it cannot be."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise EdgeSpecError(f"Cannot listen on host '{host}' ({exc.strerror}); pass an address such as 127.0.0.1 "
                            "with --host.") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise EdgeSpecError(f"Port {port} on {host} is in use (another server?); pass another --port, or 0 for "
                                "any free one.") from None
        if exc.errno == errno.EACCES:
            raise EdgeSpecError(f"Port {port} needs privileges this user lacks; pass a --port above 1023.") from None
        raise EdgeSpecError(f"Cannot listen on {host}:{port} ({exc.strerror}); check --host and --port.") from None
    return sock


def is_loopback(sock: socket.socket) -> bool:
    """True when the socket only accepts connections from this machine."""
    return ipaddress.ip_address(sock.getsockname()[0].split("%")[0]).is_loopback


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def make_server(app: Any, *, log_level: str = "info", access_log: bool = True, grace: float = GRACE_SECONDS,
                on_start: Callable[[], None] | None = None) -> uvicorn.Server:
    """A uvicorn server for ``app`` that stops gracefully (see :class:`_Server`)."""
    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=int(grace) + 5, server_header=False)  # a backstop only
    drain = getattr(getattr(app, "state", None), "drain", None)  # set by edge_spec.serve.create_app
    return _Server(config, on_start, grace, drain)


def serve(app: Any, sock: socket.socket, *, log_level: str = "info", access_log: bool = True,
          on_start: Callable[[], None] | None = None) -> str | None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM; returns that signal's name (None if stopped otherwise).

    ``on_start`` is called once the socket accepts connections."""
    server = make_server(app, log_level=log_level, access_log=access_log, on_start=on_start)
    received: list[int] = []

    def note(sig: int, frame: Any) -> None:
        # before uvicorn installs its handlers (a very early signal): stop at once; after it shut down, uvicorn
        # re-raises the signal it handled, which lands here too: either way a signal is a normal stop
        received.append(sig)
        server.should_exit = True

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, note) for sig in handled}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started and not received:
        raise EdgeSpecError("The server did not start (see the messages above).")
    return signal.Signals(received[0]).name if received else None


class _Server(uvicorn.Server):
    """uvicorn's server, calling ``on_start`` once it listens (so a client told the URL can connect at once), and
    on shutdown first closing the listening sockets and letting the app drain: the reply in flight gets ``grace``
    seconds, then it is cancelled at its next step and still ends properly (finish_reason, [DONE]); only then
    does uvicorn close the connections."""

    def __init__(self, config: uvicorn.Config, on_start: Callable[[], None] | None, grace: float,
                 drain: Callable[[float], Awaitable[None]] | None) -> None:
        super().__init__(config)
        self.on_start, self.grace, self.drain = on_start, grace, drain

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.on_start is not None:
            self.on_start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for listener in getattr(self, "servers", []):
            listener.close()  # no new connections while the app drains
        if self.drain is not None and not self.force_exit:
            await self.drain(self.grace)
        await super().shutdown(sockets=sockets)
