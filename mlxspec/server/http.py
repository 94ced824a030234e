"""`mlxspec serve`: an OpenAI-compatible HTTP server on the standard library.

    mlxspec serve --model smollm2-135m --draft smollm2-135m --port 8080

Endpoints: POST /v1/chat/completions, POST /v1/completions (stream or not),
GET /v1/models, GET /health, and a chat page at /.  HTTP threads parse and check
a request and tokenize its prompt (every malformed request is a JSON error
before it takes a queue place: server/requests.py), then hand it to the engine,
which runs one generation at a time in the main thread (server/engine.py), and
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
import queue
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import urlsplit

from ..errors import MlxspecError
from .engine import Job, QueueFull
from .guard import FD_ERRORS, DeadlineReader, check_framing, check_json_type, encode_guarded, slow_request, unauthorized
from .requests import RequestError, encode, fit_context, parse_json, parse_request, sampling_params
from .responses import SSE_DONE, Shapes, openai_finish, sse
from ..util.untrusted import printable

DEFAULT_MAX_BODY = 4 * 1024 * 1024
REQUEST_TIMEOUT = 30  # seconds a client may take to send a request (headers and body); the template, to render it
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
          "/chat/completions": "chat", "/completions": "completion"}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # set by `serve`: engine, pair, model_id, model_ids, api_key, defaults, max_tokens, max_body, page, verbose, gate
    tokenizer_lock = threading.Lock()
    request_timeout = REQUEST_TIMEOUT
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
    def _send(self, status: int, body: bytes, ctype: str, close: bool = False):
        self._disarm()
        self._responded = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj, close: bool = False):
        self._send(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), "application/json", close)

    def _error(self, e: RequestError):
        self._json(e.status, e.body(), close=True)

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

    def _events(self, job: Job):
        """The job's events; cancels the job and stops when the client hangs up."""
        while True:
            try:
                ev = job.events.get(timeout=0.05)
            except queue.Empty:
                if self._client_gone():
                    job.cancel()
                    self.close_connection = True
                    return
                continue
            yield ev
            if ev[0] in ("done", "error"):
                return

    # -- routes -------------------------------------------------------------------
    def do_GET(self):
        path = urlsplit(self.path).path
        try:
            self._screen()
        except RequestError as e:
            return self._error(e)
        self._disarm()
        if path == "/health":
            self._json(200, {"status": "ok", "model": self.server.model_id, **self.server.engine.health()})
        elif path in ("/", "/index.html"):
            self._send(200, self.server.page, "text/html; charset=utf-8")
        elif path in ("/v1/models", "/models"):
            if not self._authorized():
                return self._error(unauthorized())
            self._json(200, {"object": "list", "data": [
                {"id": self.server.model_id, "object": "model", "created": 0, "owned_by": "mlxspec"}]})
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
            job = Job(history, params, max_tokens, req.stop, req.num_draft)
            try:
                s.engine.submit(job)
            except QueueFull as e:
                raise RequestError(str(e), status=429, code="queue_full", kind="rate_limit_error")
        except RequestError as e:
            return self._error(e)
        shapes = Shapes(kind, req.model or self.server.model_id)
        try:
            if req.stream:
                self._stream(job, shapes, req.include_usage)
            else:
                self._complete(job, shapes)
        except BaseException:  # the client hung up while we wrote (OSError), or a bug: stop generating for it
            job.cancel()
            raise

    def _complete(self, job: Job, shapes: Shapes):
        pieces = []
        for ev in self._events(job):
            if ev[0] == "text":
                pieces.append(ev[1])
            elif ev[0] == "done":
                _, stats, finish, num_draft = ev
                self._json(200, shapes.full("".join(pieces), openai_finish(finish), stats, num_draft))
            else:
                self._error(RequestError(ev[1], status=500, code="generation_failed", kind="server_error"))

    def _stream(self, job: Job, shapes: Shapes, include_usage: bool):
        self._disarm()
        self._streaming = self._responded = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        write = self.wfile.write
        if shapes.kind == "chat":
            write(sse(shapes.chunk(None, role=True)))
        for ev in self._events(job):
            if ev[0] == "text":
                write(sse(shapes.chunk(ev[1], from_draft=ev[2])))
            elif ev[0] == "done":
                _, stats, finish, num_draft = ev
                write(sse(shapes.chunk(None, finish=openai_finish(finish))))
                if include_usage:
                    write(sse(shapes.usage_chunk(stats, num_draft)))
                write(SSE_DONE)
            else:
                write(sse(RequestError(ev[1], status=500, code="generation_failed", kind="server_error").body()))
                write(SSE_DONE)


def chat_page() -> bytes:
    return resources.files("mlxspec.server").joinpath("static", "chat.html").read_bytes()
