"""The ASGI app (Starlette): routes, API key, body limit, and the bridge from requests to the engine's worker.

``create_app(engine, ServeConfig(...))`` returns an app any ASGI server can run; ``edge_spec.serve.run``
runs it with uvicorn. Each generation request becomes a :class:`~edge_spec.serve.worker.Job`; the
request's coroutine reads the job's events from an asyncio queue the worker thread fills, and a
client that goes away cancels its job (queued: dropped; running: stopped at the next step).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from edge_spec.errors import EdgeSpecError
from edge_spec.runtime.config import GenerationConfig, StreamEvent
from edge_spec.runtime.fim import engine_ids, no_fim_message, stop_ids
from edge_spec.serve import infill as fim
from edge_spec.serve import requests as rq
from edge_spec.serve import tools as tl
from edge_spec.serve.errors import APIError
from edge_spec.serve.logprobs import Tracker
from edge_spec.serve.reply import Reply
from edge_spec.serve.requests import ChatRequest, CompletionRequest, Sampling
from edge_spec.serve.responses import Shaper, sse
from edge_spec.serve.worker import Failed, Finished, Job, QueueFull, Started, Worker

log = logging.getLogger("edge_spec.serve")


@dataclass(frozen=True)
class ServeConfig:
    """How the server behaves around the engine (the engine's own settings come from ``Engine.load``)."""

    model_names: tuple[str, ...] = ("demo",)  # accepted as "model"; the first is the one /v1/models lists
    api_key: str | None = None  # when set, /v1/* need "Authorization: Bearer <key>"
    queue_size: int = 16  # requests that may wait while one is served; beyond: 503 + Retry-After
    max_body_bytes: int = 1 << 20  # larger request bodies get 413
    cors_origins: tuple[str, ...] = ()  # no CORS headers unless origins are given
    reply_reserve: int = 256  # tokens kept free for the reply when old turns are dropped and max_tokens is absent

    def __post_init__(self) -> None:
        if not self.model_names or not all(isinstance(m, str) and m for m in self.model_names):
            raise EdgeSpecError("model_names must be one or more non-empty names.")
        if self.api_key is not None and not self.api_key:
            raise EdgeSpecError("The API key is empty; pass a non-empty key or none.")
        if self.queue_size < 0 or self.max_body_bytes < 1 or self.reply_reserve < 1:
            raise EdgeSpecError("queue_size must be >= 0, max_body_bytes and reply_reserve >= 1.")


class _Server:
    """Per-app state: the engine's worker and what the handlers need to know about the engine."""

    def __init__(self, engine: Any, config: ServeConfig) -> None:
        self.engine, self.config = engine, config
        self.worker = Worker(engine, config.queue_size)
        self.max_context = int(engine.plan.max_context)
        self.mode = str(engine.plan.mode)
        self.created = int(time.time())
        # compare digests: equal length whatever was sent, so the comparison time says nothing about the key
        self.key_digest = hashlib.sha256(config.api_key.encode()).digest() if config.api_key else None


def create_app(engine: Any, config: ServeConfig | None = None) -> Starlette:
    """An OpenAI-compatible ASGI app serving ``engine`` (an :class:`edge_spec.Engine`) one request at a time."""
    config = config or ServeConfig()
    server = _Server(engine, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.worker.start()
        try:
            yield
        finally:  # SIGINT/SIGTERM: the requests in flight have finished or been cancelled by now (run.py)
            await asyncio.to_thread(server.worker.stop)

    middleware = []
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST", "OPTIONS"],
                                     allow_headers=["Authorization", "Content-Type"]))
    routes = [
        Route("/health", _health, methods=["GET"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/models/{model:path}", _model, methods=["GET"]),
        Route("/v1/chat/completions", _chat, methods=["POST"]),
        Route("/v1/completions", _completions, methods=["POST"]),
        Route("/infill", _infill, methods=["POST"]),  # llama-server's fill-in-the-middle (serve/infill.py)
    ]
    handlers = {APIError: _api_error, HTTPException: _http_error, Exception: _internal_error}
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=handlers, lifespan=lifespan)
    app.state.server = server
    app.state.drain = lambda timeout: asyncio.to_thread(server.worker.drain, timeout)  # edge_spec.serve.run
    return app


# ------------------------------------------------------------------------------ routes
async def _health(request: Request) -> Response:
    server: _Server = request.app.state.server
    return JSONResponse({"status": "ok", "model": server.config.model_names[0], "mode": server.mode,
                         "context": server.max_context, **server.worker.status()})


def _model_card(server: _Server) -> dict[str, Any]:
    return {"id": server.config.model_names[0], "object": "model", "created": server.created, "owned_by": "edge-spec",
            "context_length": server.max_context}


async def _models(request: Request) -> Response:
    server: _Server = request.app.state.server
    _authorize(request, server)
    return JSONResponse({"object": "list", "data": [_model_card(server)]})


async def _model(request: Request) -> Response:
    server: _Server = request.app.state.server
    _authorize(request, server)
    name = request.path_params["model"]
    if name not in server.config.model_names:
        raise APIError(404, f"The model '{name[:60]}' is not served here; this server serves "
                            f"'{server.config.model_names[0]}'.", param="model", code="model_not_found")
    return JSONResponse(_model_card(server))


async def _chat(request: Request) -> Response:
    server: _Server = request.app.state.server
    _authorize(request, server)
    data = rq.parse_json(await _read_body(request, server.config.max_body_bytes))
    req = rq.chat_request(data, server.config.model_names, server.max_context)
    tl.check_supported(server.engine, req.messages, req.tools)  # reads the manifest only: safe beside the worker
    reserve = req.sampling.max_tokens or server.config.reply_reserve
    prefix = tl.reply_prefix(req.tool_choice)
    tools = None if req.tool_choice.mode == "none" else tl.ToolReply(prefix, req.parallel_tool_calls, frozenset(
        t["function"]["name"] for t in req.tools or ()))
    reply = Reply(Shaper(True, server.config.model_names[0], server.mode), _tracker(server, req.logprobs), tools)
    return await _generate(request, server, lambda engine: _start_chat(engine, req, reserve, prefix), reply,
                           req.sampling)


async def _completions(request: Request) -> Response:
    server: _Server = request.app.state.server
    _authorize(request, server)
    data = rq.parse_json(await _read_body(request, server.config.max_body_bytes))
    req = rq.completion_request(data, server.config.model_names, server.max_context)
    suffix = fim.completion_suffix(data)
    if suffix is None:
        start: Callable[[Any], Any] = lambda engine: _start_completion(engine, req)  # noqa: E731
    elif server.engine.fim is None:
        raise fim.no_fim("suffix", no_fim_message("'suffix'"))
    else:
        start = lambda engine: _start_infill(engine, fim.InfillRequest(req.prompt, suffix, (), "", req.sampling),  # noqa: E731
                                             logprobs=req.logprobs)
    reply = Reply(Shaper(False, server.config.model_names[0], server.mode), _tracker(server, req.logprobs),
                  base=len(req.prompt))
    return await _generate(request, server, start, reply, req.sampling)


async def _infill(request: Request) -> Response:
    server: _Server = request.app.state.server
    _authorize(request, server)
    if server.engine.fim is None:
        raise fim.no_fim("input_prefix", no_fim_message("/infill"))
    data = rq.parse_json(await _read_body(request, server.config.max_body_bytes))
    req = fim.infill_request(data, server.config.model_names, server.max_context)
    reply = Reply(fim.InfillShaper(server.config.model_names[0], server.mode, req.sampling))
    return await _generate(request, server, lambda engine: _start_infill(engine, req, llama=True), reply,
                           req.sampling)


def _tracker(server: _Server, logprobs: int | None) -> Tracker | None:
    return None if logprobs is None else Tracker(server.engine.token_bytes)


# ------------------------------------------------------------------------------ in the worker thread
def _generation_config(s: Sampling, capacity: int, logprobs: int | None = None) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=s.max_tokens or capacity, temperature=s.temperature, top_k=s.top_k,
                            top_p=s.top_p, min_p=s.min_p, seed=s.seed, stop=s.stop, logprobs=logprobs)


def _start_chat(engine: Any, req: ChatRequest, reserve: int, prefix: str = "") -> tuple[Any, dict[str, Any]]:
    messages = list(req.messages)
    tools = None if req.tool_choice.mode == "none" else req.tools
    # only what a request uses is passed on (the engine renders tool messages in the history by itself)
    kw: dict[str, Any] = {k: v for k, v in (("tools", tools), ("reply_prefix", prefix)) if v}
    try:  # the same turn-dropping as `edge-spec chat`: oldest turns go, the system prompt stays
        kept, dropped = engine.fit_chat(messages, reserve, **kw)
    except EdgeSpecError as exc:
        engine.encode_chat(messages, **kw)  # a role order the template forbids raises here: 400 invalid_value (worker)
        raise APIError(400, str(exc), param="messages", code="context_length_exceeded") from None
    capacity = int(engine.plan.max_context)
    config = _generation_config(req.sampling, capacity, req.logprobs)
    return engine.chat(kept, config, stream=True, **kw), {"dropped_messages": dropped}


def _start_completion(engine: Any, req: CompletionRequest) -> tuple[Any, dict[str, Any]]:
    ids = engine.tokenizer.encode(req.prompt).ids
    capacity = int(engine.plan.max_context)
    if len(ids) >= capacity:
        raise APIError(400, f"The prompt is {len(ids)} tokens but the context holds {capacity} (prompt and reply "
                            "together); shorten it or start the server with a larger --max-context.",
                       param="prompt", code="context_length_exceeded")
    return engine.stream(ids, _generation_config(req.sampling, capacity, req.logprobs)), {}


def _start_infill(engine: Any, req: fim.InfillRequest, llama: bool = False,
                  logprobs: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Fill in the middle as ``Engine.infill`` does; ``llama``: for /infill's answer, note the prompt's text and
    when the first token came."""
    capacity = int(engine.plan.max_context)
    cfg = _generation_config(req.sampling, capacity, logprobs)
    ids = engine_ids(engine.tokenizer, engine.fim, req.prefix, req.suffix, req.extra, req.prompt, capacity,
                     cfg.max_new_tokens)
    if len(ids) >= capacity:
        raise APIError(400, f"The infill prompt is {len(ids)} tokens but the context holds {capacity} (prompt and "
                            "reply together); send less text around the cursor or start the server with a larger "
                            "--max-context.", param="input_prefix" if llama else "prompt",
                       code="context_length_exceeded")
    cfg = dataclasses.replace(cfg, stop_token_ids=stop_ids(engine.fim, engine.manifest.tokenizer),
                              n_indent=req.n_indent, t_max_predict_ms=req.t_max_predict_ms)
    if not llama:
        return engine.stream(ids, cfg), {}
    info: dict[str, Any] = {"prompt": engine.tokenizer.decode(ids, skip_special_tokens=False)}
    return fim.timed(engine.stream(ids, cfg), info), info


# ------------------------------------------------------------------------------ the bridge
async def _generate(request: Request, server: _Server, start: Callable[[Any], Any], reply: Reply,
                    s: Sampling) -> Response:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()

    def deliver(item: object) -> None:  # called from the worker thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone, nobody listens
            loop.call_soon_threadsafe(queue.put_nowait, item)

    job = Job(start, deliver)
    try:
        server.worker.submit(job)
    except QueueFull as full:
        if full.closing:
            raise APIError(503, "The server is shutting down.", type="server_error",
                           code="server_shutting_down") from None
        raise APIError(503, f"The server is busy: {server.config.queue_size} requests are already waiting for the "
                            "model; retry after the time in the Retry-After header.", type="server_error",
                       code="server_busy", headers={"Retry-After": str(full.retry_after)}) from None
    if s.stream:
        first = await _unless_disconnected(request, queue.get(), server, job)
        if first is None:
            return Response(status_code=499)  # nobody reads it: the client left while the request waited
        if isinstance(first, Failed):
            raise first.error
        return StreamingResponse(_stream(server, job, queue, reply, first.info, s.include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    body = await _unless_disconnected(request, _collect(queue, reply), server, job)
    return JSONResponse(body) if body is not None else Response(status_code=499)


async def _collect(queue: asyncio.Queue[object], reply: Reply) -> dict[str, Any]:
    info: dict[str, Any] = {}
    while True:
        item = await queue.get()
        if isinstance(item, StreamEvent):
            reply.add(item)
        elif isinstance(item, Started):
            info = item.info
        elif isinstance(item, Finished):
            return reply.whole(item.stats, {**info, "cancelled": item.cancelled})
        elif isinstance(item, Failed):
            raise item.error


async def _stream(server: _Server, job: Job, queue: asyncio.Queue[object], reply: Reply, info: dict[str, Any],
                  include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE body. Leaving it early (the client disconnected: Starlette cancels it) cancels the job."""
    try:
        if reply.shaper.chat:
            yield sse(reply.shaper.chunk(role=True))
        while True:
            item = await queue.get()
            if isinstance(item, StreamEvent):
                for chunk in reply.chunks(item):
                    yield sse(chunk)
            elif isinstance(item, Finished):
                for chunk in reply.last(item.stats, {**info, "cancelled": item.cancelled}, include_usage):
                    yield sse(chunk)
                if reply.shaper.sse_done:
                    yield sse("[DONE]")
                return
            elif isinstance(item, Failed):  # the status line is sent already: the error is an event
                yield sse(item.error.body())
                return
    finally:
        server.worker.cancel(job)  # no-op when it finished


async def _unless_disconnected(request: Request, work: Any, server: _Server, job: Job) -> Any:
    """Await ``work`` unless the client disconnects first; then cancel the job and return None."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            server.worker.cancel(job)
    if not task.done() or task.cancelled():
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ------------------------------------------------------------------------------ helpers
def _authorize(request: Request, server: _Server) -> None:
    if server.key_digest is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else ""
    if not hmac.compare_digest(hashlib.sha256(given.encode()).digest(), server.key_digest):
        what = "missing" if not given else "incorrect"
        raise APIError(401, f"The API key is {what}; send the server's key as 'Authorization: Bearer KEY'.",
                       code="invalid_api_key")


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, or 413 when it is larger than ``limit`` bytes (read to its end first, up to 16x the limit,
    so a client that is still sending sees the 413 rather than a reset connection)."""
    declared = request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                too_large = True
                if size > 16 * limit:
                    break
            elif not too_large:
                chunks.append(chunk)
    except ClientDisconnect:  # nobody will read the answer; say why in the access log's status
        raise APIError(400, "The client disconnected while sending the request.", code="client_disconnected") \
            from None
    if too_large:
        raise APIError(413, f"The request body is larger than this server's limit of {limit} bytes; send a shorter "
                            "conversation.", code="request_too_large")
    return b"".join(chunks)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"There is no {request.method} {request.url.path} here; the API is under /v1 (chat/completions, " \
                  "completions, models), with /infill and /health."
    elif exc.status_code == 405:
        message = f"{request.url.path} does not take {request.method}."
    else:
        message = str(exc.detail)
    error = APIError(exc.status_code, message, code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code))
    return JSONResponse(error.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("request failed", exc_info=exc)
    error = APIError(500, "The server failed on this request (see the server log); the next request is served "
                          "normally.", type="server_error", code="internal_error")
    return JSONResponse(error.body(), status_code=500)
