"""`mlxspec serve`: an OpenAI-compatible HTTP server on the standard library.

    mlxspec serve --model smollm2-135m --draft smollm2-135m --port 8080

Endpoints: POST /v1/chat/completions, POST /v1/completions (stream or not),
GET /v1/models, GET /v1/models/{id}, GET /health, GET /stats (the streams
running now, the slots' caches), and a chat page at /.  The
port opens before the models load: until they are loaded and calibrated
(`server.engine` is None) /health answers 503 {"status": "loading", ...} and
every /v1 route 503 with Retry-After.  Web pages from allowed origins
(guard.Gate.origin_allowed) get CORS: an OPTIONS preflight is answered 204, and
every response to them carries Access-Control-Allow-Origin.  A queued
streaming client gets SSE keep-alive comments while it waits.  HTTP threads parse and check
a request and tokenize its prompt (every malformed request is a JSON error
before it takes a queue place: server/requests.py), then hand it to the engine,
which runs up to --parallel generations in the main thread, a round of each in
turn (server/engine.py, server/scheduler.py), and
write what it produces as JSON or as server-sent events (server/responses.py).
While waiting, a handler watches its socket: a client that hangs up cancels its
generation before the next draft/verify round.  What a request must be to get
in (Host, Origin, Content-Type, framing, a whole-request deadline) and what
bounds the model's chat template and tokenizer: server/guard.py.
"""

from __future__ import annotations

import hmac
import io
import json
import os
import re
import queue
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from ..errors import MlxspecError
from .engine import Job, QueueFull
from .page import PAGE_HEADERS, STATIC, static_file
from .guard import FD_ERRORS, DeadlineReader, check_framing, check_json_type, encode_guarded, slow_request, unauthorized
from .requests import RequestError, encode, fit_context, parse_json, parse_request, sampling_params
from .responses import SSE_DONE, Shapes, openai_finish, sse
from ..util.untrusted import printable

DEFAULT_MAX_BODY = 4 * 1024 * 1024
REQUEST_TIMEOUT = 30  # seconds a client may take to send a request (headers and body); the template, to render it
KEEPALIVE = 15.0  # seconds without an event after which a waiting stream gets an SSE comment
CORS_MAX_AGE = 600  # seconds a browser may cache a preflight's answer
CORS_METHODS = "GET, POST, OPTIONS"
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
          "/chat/completions": "chat", "/completions": "completion"}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # set by `serve`: engine, pair, model_id, model_ids, api_key, defaults, max_tokens, max_body, page, verbose, gate
    tokenizer_lock = threading.Lock()
    request_timeout = REQUEST_TIMEOUT
    engine = None  # None while the models load and calibrate: /health says "loading", /v1 answers 503
    loading: dict = {}  # while loading: {"phase": "loading" | "calibrating", "since": time.time()}
    keepalive = float(os.environ.get("MLXSPEC_SSE_KEEPALIVE", KEEPALIVE) or KEEPALIVE)
    spare = None  # a Spare descriptor, set by `serve`

    def get_request(self):
        try:
            return super().get_request()
        except OSError as e:
            if e.errno in FD_ERRORS and self.spare is not None:
                self.spare.refuse_one(self.socket)  # and a pause: no busy loop at the descriptor limit
            raise

    def handle_error(self, request, client_address):
        """One line on stderr instead of socketserver's traceback; a client that hung up is not an error."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        sys.stderr.write(f"mlxspec serve: a request from {client_address[0]} failed: {type(exc).__name__}: "
                         f"{printable(str(exc), 200)}\n")


class Server6(Server):
    address_family = socket.AF_INET6


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mlxspec"
    timeout = REQUEST_TIMEOUT
    _streaming = False  # headers of an event stream sent: an error can no longer be a JSON response
    _deadline = None  # time.monotonic() by which the request being read must have arrived
    timed_out = False  # the deadline passed with part of a request read
    _responded = False

    def setup(self):
        super().setup()
        self.rfile.close()  # reads go through the deadline instead
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, self, self.timeout))

    def time_left(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def _disarm(self):
        """The request is read: back to the plain per-operation socket timeout (for the reply)."""
        if self._deadline is not None:
            self._deadline = None
            self.connection.settimeout(self.timeout)

    def handle_one_request(self):
        self._deadline = time.monotonic() + self.server.request_timeout
        self.timed_out = self._responded = False
        self.requestline, self.request_version = "", "HTTP/1.1"  # for a 408 before the request line is whole
        super().handle_one_request()
        if self.timed_out and not self._responded:  # a slow client: one JSON line, then the connection closes
            self.timed_out = False
            try:
                self._error(slow_request(self.server.request_timeout))
            except OSError:
                pass

    def log_message(self, format, *args):
        if self.server.verbose:
            sys.stderr.write(printable(f"{self.address_string()} {format % args}", 300) + "\n")

    # -- responses ------------------------------------------------------------
    def _cors(self):
        """Access-Control-Allow-Origin for a page from an allowed origin (guard.Gate decides)."""
        origin = self.headers.get("Origin") if self.headers is not None else None
        if origin and self.server.gate.origin_allowed(origin, self.headers.get("Host")):
            self.send_header("Access-Control-Allow-Origin", origin.strip())
            self.send_header("Vary", "Origin")

    def _send(self, status: int, body: bytes, ctype: str, close: bool = False, headers: dict | None = None):
        self._disarm()
        self._responded = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if getattr(self.server, "gate", None) is not None and getattr(self, "headers", None) is not None:
            self._cors()
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj, close: bool = False, headers: dict | None = None):
        self._send(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), "application/json", close,
                   headers)

    def _error(self, e: RequestError):
        self._json(e.status, e.body(), close=True, headers=e.headers)

    def send_error(self, code, message=None, explain=None):
        """The base class's own errors (a bad request line, an unknown method) as JSON too."""
        if code == 501:  # a method this server has no handler for
            code, message = 405, f"method {printable(str(self.command), 20)} is not allowed here"
        try:
            self._error(RequestError(message or self.responses.get(code, ("error",))[0], status=code,
                                     code=str(code)))
        except OSError:
            self.close_connection = True

    # -- plumbing ---------------------------------------------------------------
    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None:
            return True
        given = self.headers.get("Authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        return hmac.compare_digest(token.encode("utf-8", "replace"), key.encode("utf-8"))

    def _screen(self):
        """What every request must pass before it is routed (server/guard.py)."""
        check_framing(self.command, self.headers)
        self.server.gate.check(self.headers)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise RequestError("send the body with a Content-Length (chunked uploads are not supported)",
                               status=411, code="length_required")
        n = self.headers.get("Content-Length")
        if n is None:
            raise RequestError("a Content-Length header is required", status=411, code="length_required")
        try:
            n = int(n)
            if n < 0:
                raise ValueError
        except ValueError:
            raise RequestError("the Content-Length header is not a number", code="invalid_header")
        if n > self.server.max_body:
            raise RequestError(f"the request body is {n} bytes; this server takes at most {self.server.max_body} "
                               "(--max-request-bytes)", status=413, code="request_too_large")
        try:
            body = self.rfile.read(n)
        except (socket.timeout, TimeoutError):
            raise slow_request(self.server.request_timeout)
        self._disarm()
        if len(body) < n:
            raise RequestError("the request body is shorter than its Content-Length", code="incomplete_body")
        return body

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _events(self, job: Job, keepalive=None):
        """The job's events; cancels the job and stops when the client hangs up.
        `keepalive()` is called after every `server.keepalive` seconds without an event."""
        quiet_since = time.monotonic()
        while True:
            try:
                ev = job.events.get(timeout=0.05)
            except queue.Empty:
                if self._client_gone():
                    job.cancel()
                    self.close_connection = True
                    return
                if keepalive is not None and time.monotonic() - quiet_since >= self.server.keepalive:
                    keepalive()  # a client gone raises OSError here: the job is cancelled by _post
                    quiet_since = time.monotonic()
                continue
            quiet_since = time.monotonic()
            yield ev
            if ev[0] in ("done", "error"):
                return

    # -- routes -------------------------------------------------------------------
    def _not_ready(self) -> RequestError | None:
        """A 503 with Retry-After while the models load and calibrate; None once the server is ready."""
        if self.server.engine is not None:
            return None
        phase = self.server.loading.get("phase", "loading")
        return RequestError(f"the server is starting ({phase} the models); retry in a few seconds (GET /health "
                            "says when it is ready)", status=503, code="model_loading", kind="server_error",
                            headers={"Retry-After": "2"})

    def _loading_health(self) -> dict:
        since = self.server.loading.get("since")
        return {"status": "loading", "model": self.server.model_id, "phase": self.server.loading.get("phase"),
                "elapsed_s": None if since is None else round(time.time() - since, 1)}

    def _model(self, model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "mlxspec"}

    def do_OPTIONS(self):
        """A CORS preflight: 204 with the Access-Control-Allow-* headers for an allowed origin
        (a foreign one is a 403 from the gate, without them, so the browser stops there)."""
        try:
            self._screen()
        except RequestError as e:
            return self._error(e)
        self._disarm()
        self._responded = True
        self.send_response(204)
        self.send_header("Allow", CORS_METHODS)
        if self.headers.get("Origin"):
            asked = [h.strip() for h in self.headers.get("Access-Control-Request-Headers", "").split(",")]
            allowed = ["Authorization", "Content-Type"] + [h for h in asked if h and HEADER_NAME.match(h)
                                                           and h.lower() not in ("authorization", "content-type")]
            self.send_header("Access-Control-Allow-Methods", CORS_METHODS)
            self.send_header("Access-Control-Allow-Headers", ", ".join(allowed[:64]))
            self.send_header("Access-Control-Max-Age", str(CORS_MAX_AGE))
            self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        path = urlsplit(self.path).path
        try:
            self._screen()
        except RequestError as e:
            return self._error(e)
        self._disarm()
        s = self.server
        if path == "/health":
            if s.engine is None:
                return self._json(503, self._loading_health(), headers={"Retry-After": "2"})
            self._json(200, {"status": "ok", "model": s.model_id, **s.engine.health()})
        elif path == "/stats":
            if s.engine is None:
                return self._json(503, self._loading_health(), headers={"Retry-After": "2"})
            self._json(200, {"model": s.model_id, **s.engine.stats()})
        elif path in ("/", "/index.html"):
            self._send(200, s.page, "text/html; charset=utf-8", headers=PAGE_HEADERS)
        elif path in STATIC:
            self._send(200, static_file(path), STATIC[path], headers=PAGE_HEADERS)
        elif path in ("/v1/models", "/models") or path.startswith(("/v1/models/", "/models/")):
            if not self._authorized():
                return self._error(unauthorized())
            if (e := self._not_ready()) is not None:
                return self._error(e)
            if path in ("/v1/models", "/models"):
                return self._json(200, {"object": "list", "data": [self._model(s.model_id)]})
            wanted = unquote(path.split("/models/", 1)[1])
            if wanted not in s.model_ids:
                return self._error(RequestError(f"model {printable(repr(wanted), 100)} is not served here; this "
                                                f"server has {s.model_id!r} (GET /v1/models)", param="model",
                                                status=404, code="model_not_found"))
            self._json(200, self._model(wanted))
        else:
            self._error(RequestError(f"no such endpoint: GET {printable(path, 100)}", status=404, code="not_found"))

    def do_POST(self):
        try:
            self._post()
        except OSError:  # the client hung up
            self.close_connection = True
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a bug (or a panic in the model's Rust code): a one-line 500, never a traceback
            sys.stderr.write(f"mlxspec serve: internal error: {type(e).__name__}: {printable(str(e), 200)}\n")
            self.close_connection = True
            if not self._streaming and not self._responded:
                self._error(RequestError(f"internal error ({type(e).__name__})", status=500,
                                         code="internal_error", kind="server_error"))

    def _post(self):
        path = urlsplit(self.path).path
        try:
            self._screen()
            kind = ROUTES.get(path)
            if kind is None:
                raise RequestError(f"no such endpoint: POST {printable(path, 100)}", status=404, code="not_found")
            if not self._authorized():
                raise unauthorized()
            if (e := self._not_ready()) is not None:
                raise e
            check_json_type(self.headers)
            req = parse_request(kind, parse_json(self._body()))
            s = self.server
            if req.model is not None and req.model not in s.model_ids:
                raise RequestError(f"model {printable(repr(req.model), 100)} is not served here; this server has "
                                   f"{s.model_id!r} (GET /v1/models)", param="model", status=404,
                                   code="model_not_found")
            params = sampling_params(s.defaults, req)
            history = encode_guarded(s.tokenizer_lock, lambda: encode(s.pair, req), s.request_timeout)
            max_tokens = fit_context(len(history), req.max_tokens, s.max_tokens, s.pair.context_length)
            try:
                s.engine.decoder.check_tokens(history)
            except MlxspecError as e:
                raise RequestError(str(e), param="prompt", code="invalid_prompt")
            job = Job(history, params, max_tokens, req.stop, req.num_draft, logprobs=req.logprobs)
            try:
                s.engine.submit(job)
            except QueueFull as e:
                raise RequestError(str(e), status=429, code="queue_full", kind="rate_limit_error",
                                   headers={"Retry-After": str(e.retry_after)})
        except RequestError as e:
            return self._error(e)
        shapes = Shapes(kind, req.model or self.server.model_id, req, self.server.pair.tokenizer)
        try:
            if req.stream:
                self._stream(job, shapes, req.include_usage)
            else:
                self._complete(job, shapes)
        except BaseException:  # the client hung up while we wrote (OSError), or a bug: stop generating for it
            job.cancel()
            raise

    def _complete(self, job: Job, shapes: Shapes):
        for ev in self._events(job):
            if ev[0] == "text":
                shapes.add(ev)  # its text, and its tokens' logprobs when asked for
            elif ev[0] == "done":
                _, stats, finish, num_draft = ev
                self._json(200, shapes.full(None, openai_finish(finish), stats, num_draft))
            else:
                self._error(RequestError(ev[1], status=500, code="generation_failed", kind="server_error"))

    def _stream(self, job: Job, shapes: Shapes, include_usage: bool):
        self._disarm()
        self._streaming = self._responded = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self._cors()
        self.end_headers()
        self.close_connection = True
        write = self.wfile.write
        if shapes.kind == "chat":
            write(sse(shapes.chunk(None, role=True)))

        def keepalive():  # an SSE comment: clients ignore it, proxies and idle timers see a live stream
            write(b": keep-alive\n\n")
            self.wfile.flush()

        for ev in self._events(job, keepalive):
            if ev[0] == "text":
                for c in shapes.stream_text(ev):  # tool calls are held back to the end (server/tools.py)
                    write(sse(c))
            elif ev[0] == "done":
                _, stats, finish, num_draft = ev
                for c in shapes.stream_end(openai_finish(finish)):
                    write(sse(c))
                if include_usage:
                    write(sse(shapes.usage_chunk(stats, num_draft)))
                write(SSE_DONE)
            else:
                write(sse(RequestError(ev[1], status=500, code="generation_failed", kind="server_error").body()))
                write(SSE_DONE)
