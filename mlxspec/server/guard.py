"""`mlxspec serve`: what keeps a web page, a slow client or a crafted model from using or wedging the server.

* Who may talk to it (`Gate`): a request's Host must name this server (the
  loopback names, the bound address, an IP literal when bound to a wildcard,
  or an --allowed-hosts name), so a DNS-rebinding page, whose Host is its own
  domain, is refused; an Origin header (sent by browsers on cross-site
  requests) must be this server's own origin, a loopback origin, or an
  --allowed-origins one: `origin_allowed` is the one place that decides, for
  CORS too.  A POST must be `Content-Type: application/json` (a page can send
  text/plain cross-site without a CORS preflight; it cannot send JSON).
* How long a client may take to send its request (`DeadlineReader`): the
  headers and body together, not per read, so one byte every 20 s cannot hold
  a thread forever.
* How long the model's chat template and tokenizer may take (`encode_guarded`):
  Jinja compiles a template to Python, so a trace function stops a looping one
  at its deadline; the tokenizer lock is never waited on, nor held, longer; a
  Rust panic in the tokenizer (`PanicException`, a BaseException) is a
  one-line 500.
* Out of file descriptors (`refuse_one`): the pending connection is accepted
  with a spare descriptor, answered 503 and closed, and accepting pauses
  briefly, where socketserver would retry accept() at once, forever.
"""

from __future__ import annotations

import errno
import io
import ipaddress
import json
import os
import socket
import sys
import threading
import time
from urllib.parse import urlsplit

import click

from ..errors import MlxspecError
from .requests import RequestError
from ..util.untrusted import first_line, printable, regular_file

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ACCEPT_BACKOFF = 0.1  # seconds between accept() tries while out of file descriptors
FD_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


# -- Host, Origin, Content-Type ----------------------------------------------------------------------
def split_host(value: str) -> tuple[str, int | None] | None:
    """'name:port', '[::1]:port' or 'name' as (lowercase name without a final dot, port), or None."""
    try:
        parts = urlsplit("//" + value.strip())
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name or parts.username is not None or parts.path or parts.query:
        return None
    return name.rstrip(".").lower(), port


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def parse_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


class Gate:
    """The Host and Origin rules of one server (bound to `host`:`port`)."""

    def __init__(self, host: str, port: int, allowed_hosts=(), allowed_origins=()):
        self.port = port
        self.any_host = "*" in allowed_hosts
        self.names = set(LOOPBACK_NAMES) | {host.strip("[]").rstrip(".").lower()}
        self.names |= {h.strip("[]").rstrip(".").lower() for h in allowed_hosts if h != "*"}
        self.ip_hosts = is_wildcard(host)  # bound to every address: any IP literal names it
        self.any_origin = "*" in allowed_origins
        self.origins = {o.rstrip("/").lower() for o in allowed_origins if o != "*"}

    def host_allowed(self, value: str | None) -> bool:
        if value is None or self.any_host:  # no Host: an HTTP/1.0 client, never a browser
            return True
        parsed = split_host(value)
        if parsed is None:
            return False
        name = parsed[0]
        # The port is not checked: DNS rebinding needs a foreign *name*, and port forwarding
        # (ssh -L 9000:localhost:8080) legitimately changes the port.
        return name in self.names or (self.ip_hosts and is_ip(name))

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """May a page from `origin` use this server (reached as `host`)?  No Origin: not a
        cross-site browser request.  The one place that decides, for requests and CORS alike."""
        if origin is None or self.any_origin:
            return True
        origin = origin.strip().rstrip("/").lower()
        if origin in self.origins:
            return True
        try:
            parts = urlsplit(origin)
            name = parts.hostname
            parts.port  # noqa: B018 (a bad port raises)
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not name or parts.path or parts.query:
            return False  # "null" (a sandboxed frame, a file:// page) and other schemes
        if name in LOOPBACK_NAMES:
            return True  # a page served by this machine itself
        return host is not None and parts.scheme == "http" and origin == f"http://{host.strip().lower()}"

    def check(self, headers) -> None:
        """A RequestError (403) unless Host and Origin are acceptable; duplicate Hosts are refused."""
        hosts = headers.get_all("Host") or []
        if len(hosts) > 1:
            raise RequestError("the request has more than one Host header", status=400, code="invalid_header")
        host = hosts[0] if hosts else None
        if not self.host_allowed(host):
            raise RequestError(f"Host {printable(repr(host), 100)} is not this server's name; reach it as "
                               f"http://127.0.0.1:{self.port}/ or http://localhost:{self.port}/, or allow the name "
                               "with --allowed-hosts (this check stops DNS-rebinding web pages)", status=403,
                               code="host_not_allowed", kind="permission_error")
        origin = headers.get("Origin")
        if not self.origin_allowed(origin, host):
            raise RequestError(f"requests from web pages at {printable(repr(origin), 100)} are not allowed; "
                               "allow that origin with --allowed-origins", status=403, code="origin_not_allowed",
                               kind="permission_error")


def check_json_type(headers) -> None:
    ctype = headers.get("Content-Type")
    media = (ctype or "").split(";")[0].strip().lower()
    if media != "application/json":
        raise RequestError(f"send the request body as JSON with 'Content-Type: application/json' (got "
                           f"{printable(repr(ctype), 60) if ctype else 'no Content-Type'})", status=415,
                           code="unsupported_media_type")


def check_framing(command: str, headers) -> None:
    """Refuse what two HTTP parsers could read differently: repeated Content-Length, a body
    on a GET (it would be read as a second request on the connection)."""
    lengths = headers.get_all("Content-Length") or []
    if len(lengths) > 1:
        raise RequestError("the request has more than one Content-Length header", code="invalid_header")
    empty = not lengths or lengths[0].strip().isdigit() and int(lengths[0]) == 0
    if command in ("GET", "HEAD") and (headers.get("Transfer-Encoding") or not empty):
        raise RequestError(f"a {command} request must not have a body", code="invalid_request")


def slow_request(seconds) -> RequestError:
    return RequestError(f"the request did not arrive within {seconds:g} s (headers and body together; "
                        "--request-timeout)", status=408, code="request_timeout")


def unauthorized() -> RequestError:
    return RequestError("a valid API key is required: send the header 'Authorization: Bearer KEY'",
                        status=401, code="invalid_api_key", kind="authentication_error")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- the whole-request deadline --------------------------------------------------------------------
class DeadlineReader(io.RawIOBase):
    """A socket's reads, each bounded by the time left to the handler's request
    deadline (`handler.time_left()`, None: no deadline) and by `idle` seconds."""

    def __init__(self, sock, handler, idle: float):
        self.sock, self.handler, self.idle = sock, handler, idle
        self.got = 0  # bytes read while a deadline was armed

    def readable(self):
        return True

    def readinto(self, b):
        left = self.handler.time_left()
        if left is not None:
            if left <= 0:
                self.handler.timed_out = self.got > 0
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(min(left, self.idle))
        try:
            n = self.sock.recv_into(b)
        except TimeoutError:
            self.handler.timed_out = left is not None and self.got > 0
            raise
        if left is not None:
            self.got += n
        return n


# -- the chat template and the tokenizer -----------------------------------------------------------
class RenderTimeout(BaseException):
    """Raised inside a chat template past its deadline: a BaseException, so no
    `except Exception` in Jinja or transformers turns it into something else."""


def run_with_deadline(fn, seconds: float):
    """fn(), stopped with RenderTimeout at the first Python line it runs past `seconds`."""
    deadline = time.monotonic() + seconds
    clock = time.monotonic

    def trace(frame, event, arg):
        if clock() > deadline:
            raise RenderTimeout
        return trace

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        return fn()
    finally:
        sys.settrace(old)


def encode_guarded(lock: threading.Lock, fn, seconds: float):
    """fn() (template and tokenize a request) under `lock`, waited on and run for at most
    `seconds` each; what the model's code raises past `except Exception` is a RequestError."""
    if not lock.acquire(timeout=seconds):
        raise RequestError(f"the tokenizer has been busy with another request for {seconds:g} s; retry later",
                           status=503, code="tokenizer_busy", kind="server_error")
    try:
        return run_with_deadline(fn, seconds)
    except RenderTimeout:
        raise RequestError(f"the model's chat template or tokenizer did not finish within {seconds:g} s and was "
                           "stopped (a loop in the template?); fix the model's chat_template", status=500,
                           code="template_timeout", kind="server_error") from None
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except Exception:
        raise
    except BaseException as e:  # pyo3's PanicException: the tokenizer's Rust code panicked
        raise RequestError(f"the model's tokenizer failed on this prompt ({type(e).__name__}: "
                           f"{printable(first_line(e), 150)})", status=500, code="tokenizer_failed",
                           kind="server_error") from None
    finally:
        lock.release()


# -- out of file descriptors -----------------------------------------------------------------------
class Spare:
    """One file descriptor held back, to accept (and refuse) a connection when there are none left."""

    BODY = json.dumps(RequestError("the server is out of file descriptors (ulimit -n); retry later", status=503,
                                   code="server_overloaded", kind="server_error").body()).encode()

    def __init__(self):
        self.fd = self._open()
        self.noted = 0.0

    @staticmethod
    def _open():
        try:
            return os.open(os.devnull, os.O_RDONLY)
        except OSError:
            return None

    def refuse_one(self, listener: socket.socket) -> None:
        """Called when accept() failed for want of descriptors."""
        now = time.monotonic()
        if now - self.noted > 60:
            self.noted = now
            sys.stderr.write("mlxspec serve: out of file descriptors (ulimit -n): refusing new connections "
                             "until some close\n")
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            try:
                conn, _ = listener.accept()
                try:
                    conn.setblocking(False)
                    conn.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                              b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(self.BODY), self.BODY))
                except OSError:
                    pass
                finally:
                    conn.close()
            except OSError:
                pass
            self.fd = self._open()
        time.sleep(ACCEPT_BACKOFF)  # never a busy loop: accept() would fail again at once


# -- the API key ------------------------------------------------------------------------------------
def resolve_api_key(api_key: str | None, key_file: str | None) -> str | None:
    """--api-key, --api-key-file or $MLXSPEC_API_KEY (at most one); an empty key is refused,
    never read as 'no key'."""
    env = os.environ.get("MLXSPEC_API_KEY")
    given = [n for n, v in (("--api-key", api_key), ("--api-key-file", key_file)) if v is not None]
    if len(given) > 1:
        raise click.UsageError("give --api-key or --api-key-file, not both")
    if api_key is not None:
        if not api_key.strip():
            raise click.UsageError("--api-key is empty: give a key, or leave the option out to serve without one")
        return api_key
    if key_file is not None:
        try:
            regular_file(key_file, "--api-key-file", max_bytes=65536)
            with open(key_file, encoding="utf-8") as f:
                key = f.readline().strip()
        except (MlxspecError, OSError, UnicodeDecodeError) as e:
            raise click.UsageError(printable(str(e) if isinstance(e, MlxspecError) else
                                             f"cannot read --api-key-file {key_file}: {e}", 300))
        if not key:
            raise click.UsageError(f"--api-key-file {printable(key_file, 100)} has no key on its first line")
        return key
    if env is not None:
        if not env.strip():
            raise click.UsageError("MLXSPEC_API_KEY is set but empty: give a key, or unset it to serve without one")
        return env
    return None
