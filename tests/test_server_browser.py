"""The chat page of `mlxspec serve` in a real headless browser (Debian's `chromium`,
driven over the DevTools protocol with the `websockets` package): type a prompt,
watch the reply stream in with drafted tokens coloured and the acceptance line
under it, then a second turn that reuses the cached conversation.  A screenshot
is saved under the test's temp folder."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

import mlxspec
from mlxspec import api

from server_process import MODEL, SMOLLM2, need_smollm2, start

pytestmark = pytest.mark.real

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
if CHROMIUM is None:
    pytest.skip("no chromium: `./setup.sh test` installs Debian's chromium package when run as root "
                "(apt-get install chromium)", allow_module_level=True)
ws_client = pytest.importorskip("websockets.sync.client",
                                reason="the browser test needs the `websockets` package (pip install -e '.[test]')")

N = 20
STATS = re.compile(r"^\[\d+ tokens, [\d.]+ tok/s, acceptance \d+\.\d% \((\d+)/(\d+)\), [\d.]+ tok/pass, k=3, "
                   r"prompt (\d+)/(\d+) tok processed\]$")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start(tmp_path_factory, "serve-browser", *SMOLLM2, "--num-draft-tokens", "3")
    yield s
    s.stop()


class Browser:
    """Headless chromium and one page, spoken to over the Chrome DevTools Protocol.
    Its temp folder is its own (`tmp`), removed on close: chromium leaves its singleton-socket
    folder behind when terminated (one org.chromium.Chromium.* in /tmp per run)."""

    def __init__(self, profile):
        # short: chromium's singleton socket lives in it, and a UNIX socket path has at most
        # 107 bytes (under pytest's tmp_path, named after this test, chromium would not start)
        self.tmp = Path(tempfile.mkdtemp(prefix="mlxspec-chromium-"))
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "--window-size=1000,800", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(self.tmp)})
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                pytest.fail("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        for _ in range(100):
            pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
            pages = [p for p in pages if p["type"] == "page"]
            if pages:
                break
            time.sleep(0.1)
        self.stack = contextlib.ExitStack()
        self.ws = self.stack.enter_context(
            ws_client.connect(pages[0]["webSocketDebuggerUrl"], max_size=2**26, open_timeout=30))
        self.n = 0

    def call(self, method, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg["result"]

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def wait(self, expr, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expr}")

    def close(self):
        if hasattr(self, "stack"):
            self.stack.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


REPLY = """(() => {
  const r = document.querySelectorAll('.assistant')[%d];
  if (!r) return null;
  return {text: r.firstChild.textContent, done: r.dataset.done || '', stats: r.querySelector('.stats').textContent,
          drafts: r.querySelectorAll('.draft').length, plain: r.querySelectorAll('span:not(.draft)').length};
})()"""


def send(browser, text, index):
    """Type `text`, press Send, follow the reply as it streams; the final state and the partial texts seen."""
    browser.eval(f"document.getElementById('prompt').value = {json.dumps(text)}; "
                 "document.getElementById('send').click(); true")
    partial = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r = browser.eval(REPLY % index)
        if r and r["done"]:
            return r, partial
        if r and r["text"] and (not partial or partial[-1] != r["text"]):
            partial.append(r["text"])
        time.sleep(0.03)
    raise AssertionError("the reply did not finish")


def test_chat_page_streams_with_draft_colours_and_acceptance(server, tmp_path):
    need_smollm2()
    target = mlxspec.load(MODEL, no_draft=True)
    first = "Name three animals that live in the sea."
    ref1 = api.generate(target, [{"role": "user", "content": first}], max_tokens=N, drafter="none")
    browser = Browser(tmp_path / "profile")
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=server.url + "/")
        browser.wait("document.readyState === 'complete' && document.getElementById('model').textContent")
        assert browser.eval("document.getElementById('model').textContent") == MODEL
        browser.eval(f"document.getElementById('max_tokens').value = '{N}'; true")

        r, partial = send(browser, first, 0)
        assert r["text"] == ref1.text
        # streamed: prefixes seen before the end (the whole text may show just before the stats mark it done)
        assert all(ref1.text.startswith(p) for p in partial), partial
        assert sum(p != ref1.text for p in partial) >= 2, partial
        assert r["drafts"] > 0 and r["plain"] > 0  # accepted drafts coloured, the target's own tokens not
        m = STATS.match(r["stats"])
        assert m, r["stats"]
        accepted, drafted, processed, prompt = map(int, m.groups())
        assert 0 < accepted <= drafted and processed == prompt  # a fresh conversation: the whole prompt fed

        second = "Which one is the largest?"
        turn2 = [{"role": "user", "content": first}, {"role": "assistant", "content": ref1.text},
                 {"role": "user", "content": second}]
        ref2 = api.generate(target, turn2, max_tokens=N, drafter="none")
        r, _ = send(browser, second, 1)
        assert r["text"] == ref2.text
        m = STATS.match(r["stats"])
        assert m, r["stats"]
        processed, prompt = int(m.group(3)), int(m.group(4))
        assert prompt == len(api.encode_prompt(target.tokenizer, turn2))
        assert processed < prompt - len(api.encode_prompt(target.tokenizer, turn2[:1]))  # the first turn reused

        shot = tmp_path / "chat.png"
        shot.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"]))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
        print(f"\nscreenshot: {shot}")
    finally:
        browser.close()
    socket = tmp_path / "profile" / "SingletonSocket"  # a link into chromium's temp folder, if left
    assert not socket.is_symlink() or browser.tmp in Path(os.readlink(socket)).parents
    assert not browser.tmp.exists()
