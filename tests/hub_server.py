"""A Hugging Face Hub on loopback, for testing `mlxspec convert` with the real client.

Implements what huggingface_hub (2.x, read from its source) calls:

  GET  /api/models/{repo}[/revision/{rev}][?blobs=true]  model_info: sha, gated, siblings (+ sizes, lfs)
  GET  /api/models/{repo}/tree/{rev}[/{path}]            list_repo_tree (snapshot_download)
  HEAD /{repo}/resolve/{rev}/{path}                      hf_hub_download metadata: ETag, X-Repo-Commit,
                                                         X-Linked-Size / X-Linked-Etag (LFS), Content-Length
  GET  /{repo}/resolve/{rev}/{path}                      the bytes; Range -> 206 + Content-Range

Errors carry the X-Error-Code header huggingface_hub maps to its exceptions
(RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).  Test knobs:

  * `weight_bytes(repo)`: tensor-data bytes served (safetensors bytes past the header;
    every byte of pickle checkpoints) - headers read by range requests count 0;
  * gated repos answer 401 without `Authorization: Bearer <token>` (403 with a wrong one);
  * `interrupt(repo, file, after=N, then_status=S, then_count=K)`: the next GET of the
    file is cut off after N body bytes; the K requests after it get status S;
  * `fake_sizes`: advertise a file as bigger than it is (disk-full tests).

Run `python tests/hub_server.py --serve [--port P]` for a demo Hub with tiny repos.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".gguf")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?$")
RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class HubRepo:
    def __init__(self, repo_id: str, folder, gated: bool = False, fake_sizes: dict | None = None):
        folder = Path(folder)
        self.repo_id, self.gated = repo_id, gated
        self.files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        self.fake_sizes = dict(fake_sizes or {})
        h = hashlib.sha1(repo_id.encode())
        for name, data in self.files.items():
            h.update(name.encode() + hashlib.sha256(data).digest())
        self.sha = h.hexdigest()

    def size(self, name: str) -> int:
        return self.fake_sizes.get(name, len(self.files[name]))

    def is_lfs(self, name: str) -> bool:
        return name.endswith(LFS_SUFFIXES)

    def etag(self, name: str) -> str:
        data = self.files[name]
        if self.is_lfs(name):
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git blob id

    def data_start(self, name: str) -> int:
        """Where tensor data begins: after a safetensors header, 0 for pickles, len() otherwise."""
        data = self.files[name]
        if name.endswith(".safetensors") and len(data) >= 8:
            return 8 + struct.unpack("<Q", data[:8])[0]
        return 0 if name.endswith(PICKLE_SUFFIXES) else len(data)

    def entry(self, name: str, tree: bool = False) -> dict:
        size = self.size(name)
        lfs = {"size": size, "pointerSize": 134}
        if tree:
            return {"type": "file", "oid": self.etag(name) if not self.is_lfs(name) else "0" * 40, "size": size,
                    "path": name, **({"lfs": {**lfs, "oid": self.etag(name)}} if self.is_lfs(name) else {})}
        return {"rfilename": name, "size": size, "blobId": "0" * 40,
                **({"lfs": {**lfs, "sha256": self.etag(name)}} if self.is_lfs(name) else {})}


class HubServer:
    def __init__(self, token: str = "hf_loopback_test_token", host: str = "127.0.0.1", port: int = 0):
        self.token = token
        self.repos: dict[str, HubRepo] = {}
        self.requests: list = []  # (method, path, range header, status)
        self._weight_bytes: dict[str, int] = {}
        self._interrupts: dict = {}
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                hub._handle(self, "GET")

            def do_HEAD(self):
                hub._handle(self, "HEAD")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread = None

    # ------------------------------------------------------------ control

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def add_repo(self, repo_id: str, folder, gated: bool = False, fake_sizes: dict | None = None) -> HubRepo:
        repo = HubRepo(repo_id, folder, gated, fake_sizes)
        self.repos[repo_id] = repo
        return repo

    def weight_bytes(self, repo_id: str | None = None) -> int:
        with self._lock:
            if repo_id is None:
                return sum(self._weight_bytes.values())
            return self._weight_bytes.get(repo_id, 0)

    def reset_counters(self) -> None:
        with self._lock:
            self._weight_bytes.clear()
            self.requests.clear()
            self._interrupts.clear()

    def interrupt(self, repo_id: str, name: str, after: int, then_status: int | None = None, then_count: int = 1):
        with self._lock:
            self._interrupts[(repo_id, name)] = {"after": after, "status": then_status, "count": then_count if then_status else 0}

    # ------------------------------------------------------------ handling

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        status = self._route(h, method, path, query)
        with self._lock:
            self.requests.append((method, path, h.headers.get("Range"), status))

    def _route(self, h, method, path, query) -> int:
        m = API.match(path)
        if m and method == "GET":
            repo_id, kind, rev, sub = m.groups()
            repo = self._repo(h, repo_id, rev or "main", need_access=(kind == "tree"))
            if isinstance(repo, int):
                return repo
            if kind == "tree":
                prefix = (sub or "/").strip("/")
                names = [n for n in repo.files if n.startswith(prefix)]
                return self._json(h, [repo.entry(n, tree=True) for n in names])
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = [repo.entry(n) if blobs else {"rfilename": n} for n in repo.files]
            return self._json(h, {
                "_id": repo.sha[:24], "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0],
                "sha": repo.sha, "private": False, "disabled": False, "gated": "manual" if repo.gated else False,
                "tags": ["safetensors"], "library_name": "transformers", "siblings": siblings,
                "lastModified": "2025-01-01T00:00:00.000Z", "createdAt": "2025-01-01T00:00:00.000Z",
            })
        m = RESOLVE.match(path)
        if m:
            repo_id, rev, name = m.groups()
            repo = self._repo(h, repo_id, rev, need_access=True)
            if isinstance(repo, int):
                return repo
            if name not in repo.files:
                return self._error(h, 404, "EntryNotFound", f"{name} does not exist on {rev}", commit=repo.sha)
            return self._file(h, method, repo, name)
        return self._error(h, 404, None, "Not Found")

    def _repo(self, h, repo_id, rev, need_access):
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(h, 404, "RepoNotFound", "Repository not found")
        if rev not in ("main", repo.sha):
            return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if repo.gated and need_access:
            auth = h.headers.get("Authorization") or ""
            if auth != f"Bearer {self.token}":
                code = 403 if auth else 401
                return self._error(h, code, "GatedRepo", f"Access to model {repo_id} is restricted. "
                                   "You must have access to it and be authenticated to access it. Please log in.")
        return repo

    def _file(self, h, method, repo: HubRepo, name: str) -> int:
        data = repo.files[name]
        cut = self._plan(repo.repo_id, name, method, h.headers.get("Range"), len(data))
        if cut is not None and cut < 0:
            return self._error(h, -cut, None, "Internal Error (simulated)")
        headers = {"ETag": f'"{repo.etag(name)}"', "X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if repo.is_lfs(name):
            headers.update({"X-Linked-Size": str(repo.size(name)), "X-Linked-Etag": f'"{repo.etag(name)}"'})
        start, end, status = 0, len(data), 200
        rng = h.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m.group(1)) >= len(data):
                return self._error(h, 416, None, "Range Not Satisfiable")
            start = int(m.group(1))
            end = min(len(data), int(m.group(2)) + 1) if m.group(2) else len(data)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(end - start))
        h.end_headers()
        if method == "HEAD":
            return status
        stop = end if cut is None else min(end, start + cut)
        pos = start
        try:
            while pos < stop:
                chunk = data[pos:min(stop, pos + 65536)]
                h.wfile.write(chunk)
                self._count(repo, name, pos, pos + len(chunk))
                pos += len(chunk)
            h.wfile.flush()
        except OSError:
            h.close_connection = True
            return status
        if cut is not None:
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        return status

    def _plan(self, repo_id, name, method, rng, size):
        """Bytes after which to cut this GET (None: serve it all; negative: fail with that status).

        The cut hits the first GET asking for more than `after` bytes (so reading a
        header with a small range request is not cut); the failures hit the GETs after it."""
        key = (repo_id, name)
        with self._lock:
            plan = self._interrupts.get(key)
            if not plan or method != "GET":
                return None
            if plan["after"] is not None:
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", (rng or "bytes=0-").strip())
                start = int(m.group(1)) if m else 0
                end = int(m.group(2)) + 1 if m and m.group(2) else size
                if end - start <= plan["after"]:
                    return None
                cut, plan["after"] = plan["after"], None
            else:
                plan["count"] -= 1
                cut = -plan["status"]
            if plan["count"] <= 0 and plan["after"] is None:
                del self._interrupts[key]
            return cut

    def _count(self, repo: HubRepo, name: str, a: int, b: int) -> None:
        n = max(0, b - max(a, repo.data_start(name)))
        if n:
            with self._lock:
                self._weight_bytes[repo.repo_id] = self._weight_bytes.get(repo.repo_id, 0) + n

    def _json(self, h, obj) -> int:
        body = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
        return 200

    def _error(self, h, status, code, message, commit=None) -> int:
        body = json.dumps({"error": message}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
        return status


# ---------------------------------------------------------------- demo


def build_demo_repos(root) -> dict:
    """Tiny repos: a target, a matching draft, an incompatible draft, a gated and a pickle-only repo."""
    import tiny_models as tm

    root = Path(root)
    cfg = tm.config_for("llama")
    target = tm.build(cfg, seed=0, scale=3.0)
    dirs = {
        "demo/tiny-target": tm.save_model_dir(root / "target", model=target),
        "demo/tiny-draft": tm.save_model_dir(root / "draft", model=tm.perturbed(target, cfg, noise=0.05)),
        "demo/tiny-draft-renamed": tm.save_model_dir(root / "renamed", seed=2, rename={7: "<renamed>"}),
        "demo/tiny-gated": tm.save_model_dir(root / "gated", seed=3),
    }
    pickle_dir = root / "pickle"
    pickle_dir.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (pickle_dir / f).write_bytes((dirs["demo/tiny-target"] / f).read_bytes())
    (pickle_dir / "pytorch_model.bin").write_bytes(b"PK\x03\x04" + bytes(4096))
    dirs["demo/tiny-pickle"] = pickle_dir
    return dirs


def main(argv=None) -> None:
    import argparse
    import sys
    import tempfile
    import time

    sys.path.insert(0, str(Path(__file__).parent))
    import mlxspec  # noqa: F401  (OpenBLAS before mlx.core)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", action="store_true", help="serve the demo repos until interrupted")
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args(argv)
    if not args.serve:
        ap.print_help()
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = HubServer(port=args.port)
        for repo_id, folder in build_demo_repos(tmp).items():
            server.add_repo(repo_id, folder, gated=repo_id.endswith("gated"))
        with server:
            print(f"serving {', '.join(server.repos)} on {server.url} (token for gated repos: {server.token})",
                  flush=True)
            try:
                while True:
                    time.sleep(5)
                    print(f"weight bytes served so far: {server.weight_bytes()}", flush=True)
            except KeyboardInterrupt:
                pass


if __name__ == "__main__":
    main()
