"""The `mlxspec` CLI in a subprocess, run as a user runs it, and its one-line errors.

`run_cli` gives the child its own HF_HOME (so huggingface_hub and transformers
caches, including transformers' cache of downloaded modules, stay in the test's
folder) and, with `hub`, the loopback Hub of tests/hub_server.py as HF_ENDPOINT.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys


def run_cli(cwd, *args, endpoint=None, hub=None, input=None, preexec_fn=None, timeout=180, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env.update(HF_HOME=str(cwd / "hf"), HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_VERBOSITY="error")
    env.update(env_extra)  # may override the above (e.g. TRANSFORMERS_VERBOSITY)
    if endpoint or hub:
        env["HF_ENDPOINT"] = endpoint or hub.url
    return subprocess.run([sys.executable, "-m", "mlxspec.cli", *args], cwd=cwd, env=env, input=input,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)


def assert_refused(res, *needles, exit_code=1):
    """Exit 1 (2 for a usage error) with one `error:` line (the last), no traceback, naming every needle."""
    assert res.returncode == exit_code, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), res.stderr
    assert sum(ln.startswith("error: ") for ln in lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in lines[-1], lines[-1]
    return lines[-1]


def file_size_limit(nbytes: int):
    """A preexec_fn: the child cannot write a file past `nbytes` (RLIMIT_FSIZE; with SIGXFSZ
    ignored, the write fails with EFBIG), a real OS-level write failure, as on a full disk."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return limit
