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
  const body = r.querySelector('.body');
  const drafted = [...r.querySelectorAll('.draft')].reduce((n, s) => n + s.textContent.length, 0);
  return {text: body.raw, done: r.dataset.done || '', stats: r.querySelector('.stats').textContent,
          drafts: r.querySelectorAll('.draft').length, plain: body.textContent.length - drafted};
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


# -- the page itself, on the tiny pair (cheap): settings, Stop, markdown, a phone-sized screen -------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from server_process import start_tiny

    s = start_tiny(tmp_path_factory, "serve-page", "--num-draft-tokens", "3", "--parallel", "2")
    browser = Browser(tmp_path_factory.mktemp("page-profile") / "profile")
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=s.url + "/")
        browser.wait("document.readyState === 'complete' && document.getElementById('model').textContent")
        # every request body the page sends, as it sends it
        browser.eval("window.sent = []; const f = window.fetch; window.fetch = (u, o) => { "
                     "if (o && o.body) window.sent.push(JSON.parse(o.body)); return f(u, o); }; true")
        yield s, browser
    finally:
        browser.close()
        s.stop()


def test_the_page_sends_only_the_settings_the_user_set(tiny):
    server, browser = tiny
    r, _ = send(browser, "w1 w2", 0)
    sent = browser.eval("window.sent[0]")
    assert "temperature" not in sent and "max_tokens" not in sent and "seed" not in sent, sent  # the server's
    assert "num_draft_tokens" not in sent and r["text"]
    browser.eval("document.getElementById('temperature').value = '0.7'; document.getElementById('seed').value = '3';"
                 "document.getElementById('max_tokens').value = '5'; document.getElementById('drafting').click(); true")
    send(browser, "w3", 1)
    sent = browser.eval("window.sent[1]")
    assert (sent["temperature"], sent["seed"], sent["max_tokens"], sent["num_draft_tokens"]) == (0.7, 3, 5, 0), sent
    browser.eval("document.getElementById('reset').click(); for (const id of ['temperature', 'seed', 'max_tokens']) "
                 "document.getElementById(id).value = ''; document.getElementById('drafting').click(); true")


def test_stop_aborts_the_reply_and_the_server_cancels_it(tiny):
    server, browser = tiny
    browser.eval("document.getElementById('max_tokens').value = '3000'; "
                 "document.getElementById('prompt').value = 'w9 w8'; document.getElementById('send').click(); true")
    browser.wait("(document.querySelector('.assistant:last-child .body') || {}).raw")
    assert server.health()["active"] == 1
    assert browser.eval("!document.getElementById('stop').hidden && document.getElementById('send').hidden")
    browser.eval("document.getElementById('stop').click(); true")
    browser.wait("document.querySelector('.assistant:last-child').dataset.done")
    t0 = time.monotonic()
    while server.health()["active"]:
        assert time.monotonic() - t0 < 2, "the server kept generating for a page that stopped"
        time.sleep(0.01)
    r = browser.eval("(() => { const r = document.querySelector('.assistant:last-child'); "
                     "return {stats: r.querySelector('.stats').textContent, n: r.querySelector('.body').raw.length}; })()")
    assert r["stats"] == "[stopped]" and r["n"] > 0, r
    assert server.health()["last_generation"]["finish_reason"] == "cancelled"
    assert browser.eval("document.getElementById('stop').hidden && !document.getElementById('send').hidden")
    browser.eval("document.getElementById('max_tokens').value = ''; document.getElementById('reset').click(); true")


MARKDOWN = ("# Title\nSome **bold**, *it*, `x < y` and [a link](https://example.com/a).\n\n"
            "```python\ndef f():\n    return '<img src=x onerror=alert(1)>'\n```\n"
            "- one\n- two <script>window.hacked = 1</script>\n\n1. first\n2. [bad](javascript:alert(1))\n"
            "> quoted <b>not bold</b>\n")


def test_markdown_is_rendered_safely(tiny):
    _, browser = tiny
    r = browser.eval("(() => { const d = MD.render(%s); document.getElementById('log').appendChild(d); return {"
                     "h: d.querySelector('h3').textContent, strong: d.querySelector('strong').textContent,"
                     "em: d.querySelector('em').textContent, code: d.querySelector('p code').textContent,"
                     "lang: d.querySelector('.codeblock .lang').textContent,"
                     "block: d.querySelector('pre code').textContent, links: [...d.querySelectorAll('a')].map(a => a.href),"
                     "items: [...d.querySelectorAll('ul li, ol li')].map(li => li.textContent),"
                     "quote: d.querySelector('blockquote').textContent,"
                     "tags: [...d.querySelectorAll('img, script, b')].length, hacked: window.hacked || 0}; })()"
                     % json.dumps(MARKDOWN))
    assert (r["h"], r["strong"], r["em"], r["code"], r["lang"]) == ("Title", "bold", "it", "x < y", "python"), r
    assert r["block"] == "def f():\n    return '<img src=x onerror=alert(1)>'", r  # the markup is text
    assert r["links"] == ["https://example.com/a"], r  # the javascript: link stayed text
    assert r["items"] == ["one", "two <script>window.hacked = 1</script>", "first", "[bad](javascript:alert(1))"], r
    assert r["quote"] == "quoted <b>not bold</b>" and r["tags"] == 0 and r["hacked"] == 0, r
    drafted = browser.eval("MD.render([['**bo', true], ['ld** and', false]]).querySelector('strong .draft')"
                           ".textContent")
    assert drafted == "bo"  # drafted characters stay green inside the markdown
    browser.eval("document.getElementById('reset').click(); true")


@pytest.mark.parametrize("width", [1200, 390])
def test_the_page_fits_the_screen(tiny, width):
    _, browser = tiny
    browser.call("Emulation.setDeviceMetricsOverride", width=width, height=800, deviceScaleFactor=1,
                 mobile=width < 600)
    try:
        browser.eval("document.getElementById('settings').open = true; true")
        fit = browser.eval("(() => { const h = document.querySelector('header'), f = document.getElementById('form');"
                           "return {page: document.documentElement.scrollWidth, header: h.scrollWidth, "
                           "headerBox: h.getBoundingClientRect().right, form: f.getBoundingClientRect().right,"
                           "inner: window.innerWidth}; })()")
        assert fit["inner"] == width, fit
        assert max(fit["page"], fit["header"], fit["headerBox"], fit["form"]) <= width, fit
    finally:
        browser.eval("document.getElementById('settings').open = false; true")
        browser.call("Emulation.clearDeviceMetricsOverride")
