"""The CPU backend's small-batch matrix products (cpu/small_gemm.c).

Decoding multiplies 1 to 32 rows of activations by large weight matrices: one
row for a plain step, a few for a verify pass or a draft tree level.  OpenBLAS
(Debian's 0.3.21) packs the weight into panels on every `cblas_sgemm` call,
which here costs more than streaming the weight once: one row through two of the
default target's 1536 x 8960 MLP weights (110 MB) took 5-9 ms where streaming
them takes about 2.7 ms.  cpu/small_gemm.c streams each weight row once and
multiplies it into every activation row together, so one row runs at memory
speed and 8 rows cost about 1.2x one (the target's layer weights, matmuls
alone); end to end, `python benchmarks/small_gemm.py`.

The kernel is compiled here, on first use, for this machine's CPU (`cc -O3
-march=native -pthread`; its parallel loops run on one process-wide pool of threads,
cpu/thread_pool.c), cached under `cache_dir()/kernels/` by a hash of the
source, the compiler and the CPU, and loaded RTLD_GLOBAL before `mlx.core` so
that MLX's `cblas_sgemm` calls reach it; it forwards every call it is not made
for (more than 32 rows: prefill; a transposed A) to OpenBLAS.  Each output is
summed in one fixed order whatever the number of rows, so a verify pass scores
every position bit for bit as a plain step does.

The kernels folder must be this user's alone (util/private_dirs.py), and a cached
build is loaded only if its owner is this user, it is not group/other-writable
and its sha256 matches the one recorded beside it at build time
(`small_gemm-<hash>.so.sha256`); otherwise it is built again.  The compiler
runs at most BUILD_TIMEOUT_S and a held Ctrl-C (util/startup_signals.py) kills it; a
build that failed or timed out leaves `small_gemm-<hash>.failed`, and is not
tried again for a day unless the source or compiler change (`why()` says so).

No compiler, a failed build or MLXSPEC_SMALL_GEMM=0: OpenBLAS takes every call,
as before (`backend.describe()` says which).  Only our own source shipped in
the package is compiled; nothing from a model folder.

This module must not import mlx.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import time
from pathlib import Path

ENV = "MLXSPEC_SMALL_GEMM"  # "0": OpenBLAS takes every call
SOURCES = tuple(Path(__file__).with_name(f) for f in (
    "small_gemm.c", "draft_gemm.c", "draft_gemm4.c", "thread_pool.c"))  # one library
HEADERS = (Path(__file__).with_name("thread_pool.h"),)
FLAGS = ("-O3", "-march=native", "-pthread", "-shared", "-fPIC")
BUILD_TIMEOUT_S = 60  # about 3 s here; a compiler that hangs costs this once a day, not every run
RETRY_AFTER_S = 24 * 3600  # a failed build (per source, compiler and CPU) is retried after this
POLL_S = 0.05  # how often a running compile looks for a held Ctrl-C

_state: dict = {"lib": None, "why": None}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def library_path(cc: str) -> Path:
    """Where the build for this source, compiler and CPU is cached (the folder not created)."""
    from ..util.paths import cache_dir

    st = os.stat(cc)
    ident = "\0".join([*(s.read_text() for s in SOURCES + HEADERS), os.path.realpath(cc), str(st.st_size),
                       str(st.st_mtime_ns), " ".join(FLAGS), _cpu_flags(), platform.machine()])
    return cache_dir() / "kernels" / f"small_gemm-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.so"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sidecar(out: Path) -> Path:
    return out.with_name(out.name + ".sha256")


def _marker(out: Path) -> Path:
    return out.with_name(out.stem + ".failed")


def verified(out: Path) -> bool:
    """Whether the cached build `out` is this user's own (owner, mode) and unchanged since it
    was built (its sha256 as recorded beside it)."""
    from ..util.private_dirs import file_problem

    side = _sidecar(out)
    if file_problem(out) or file_problem(side):
        return False
    try:
        with open(side, "rb") as f:
            recorded = f.read(200).decode("ascii", "replace").strip()
        return recorded == _digest(out)
    except OSError:
        return False


def _recent_failure(out: Path) -> str | None:
    """The recorded reason this build failed, if it failed less than RETRY_AFTER_S ago."""
    from ..util.private_dirs import file_problem
    from ..util.untrusted import printable

    marker = _marker(out)
    if file_problem(marker):
        return None
    try:
        if time.time() - marker.stat().st_mtime >= RETRY_AFTER_S:
            return None
        with open(marker, "rb") as f:
            reason = f.read(300).decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return None
    return printable(reason[0] if reason else "?", 200)


def _write(folder: Path, final: Path, text: str) -> None:
    from ..util import tempfiles

    fd, tmp = tempfiles.mkstemp(folder, final.name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, final)
    finally:
        tempfiles.remove(tmp)


def _interrupt_pending() -> bool:
    """A Ctrl-C held by startup_signals (SIGINT blocked while the command starts)."""
    return hasattr(signal, "sigpending") and signal.SIGINT in signal.sigpending()


def _compile(cmd: list[str]) -> tuple[str, str]:
    """Run the compiler: ("ok", ""), ("failed", its first error line), ("timeout", "")
    or ("interrupted", "") after a held Ctrl-C (the compiler killed; the Ctrl-C goes on
    to the command's handler once the block ends). An unheld Ctrl-C (KeyboardInterrupt)
    kills the compiler too."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    try:
        while True:
            try:
                _, err = proc.communicate(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if _interrupt_pending():
                    return "interrupted", ""
                if time.monotonic() > deadline:
                    return "timeout", ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        lines = (err or "").strip().splitlines() or ["?"]
        return "failed", next((ln for ln in lines if "error" in ln), lines[-1]).strip()[:160]
    return "ok", ""


def build() -> Path | None:
    """The compiled kernel (built now if not cached and verified), or None (the reason in
    `why()`). The kernels folder must be this user's alone (private_dirs); a cached build
    whose owner, mode or content hash do not check out is built again; a build that failed
    or timed out is not tried again for RETRY_AFTER_S unless the source or compiler change."""
    from ..util import private_dirs, tempfiles

    cc = _compiler()
    if cc is None:
        _state["why"] = "no C compiler (cc)"
        return None
    out = library_path(cc)
    try:
        private_dirs.ensure(out.parent)
    except private_dirs.UnsafeFolder as e:
        _state["why"] = f"the kernels folder is not private ({e})"[:200]
        private_dirs.warn(f"small-batch kernel not used: {e}", key=str(e))  # once, with the TMPDIR line
        return None
    if verified(out):
        return out
    failed = _recent_failure(out)
    if failed is not None:
        _state["why"] = (f"the kernel did not compile ({failed}); not retried until the source or compiler "
                         f"changes, or a day has passed (or delete {_marker(out)})")
        return None
    try:
        tempfiles.remove_stale(out.parent)
        for p in (out, _sidecar(out)):
            p.unlink(missing_ok=True)  # a build that does not check out: built again
        tmp = tempfiles.temp_name(out.parent, out.stem)
        try:
            result, detail = _compile([cc, *FLAGS, *map(str, SOURCES), "-o", str(tmp), "-ldl", "-lm"])
            if result != "ok":
                _state["why"] = {"interrupted": "interrupted while it compiled",
                                 "timeout": f"the kernel did not compile (the compiler ran over {BUILD_TIMEOUT_S} s)",
                                 "failed": f"the kernel did not compile ({detail})"}[result]
                if result != "interrupted":
                    _write(out.parent, _marker(out), detail or f"the compiler ran over {BUILD_TIMEOUT_S} s")
                return None
            os.chmod(tmp, 0o755)
            _write(out.parent, _sidecar(out), _digest(tmp))
            os.replace(tmp, out)
            for old in out.parent.glob("small_gemm-*"):  # builds of an older source or another compiler
                if not old.name.startswith(out.stem):
                    old.unlink(missing_ok=True)
            _marker(out).unlink(missing_ok=True)
        finally:
            tempfiles.remove(tmp)
    except (OSError, subprocess.SubprocessError) as e:
        _state["why"] = f"the kernel could not be built ({e.__class__.__name__}: {e})"[:160]
        return None
    return out


def preload(blas_path: str) -> bool:
    """Build and load the kernel, forwarding what it does not take to `blas_path`.
    Must run before mlx.core is imported and before `blas_path` is loaded."""
    from . import switches

    for name, on in ((switches.ALL, switches.all_on()), (ENV, os.environ.get(ENV, "1") != "0")):
        if not on:
            _state["why"] = f"turned off ({name}=0)"
            return False
    path = build()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        if lib.mlxspec_gemm_init(blas_path.encode()) != 0:
            _state["why"] = f"it could not bind {blas_path}'s cblas_sgemm"
            return False
    except (OSError, AttributeError) as e:
        _state["why"] = f"it could not be loaded ({e})"[:160]
        return False
    lib.mlxspec_gemm_calls.restype = ctypes.c_long
    lib.mlxspec_gemm_packed_calls.restype = ctypes.c_long
    lib.mlxspec_pool_loops.restype = ctypes.c_long
    _state["lib"], _state["build"] = lib, path.stem
    return True


def build_id() -> str | None:
    """The loaded build (source, compiler and CPU hash; None when not loaded): a
    calibration measured with one build does not price another."""
    return _state.get("build") if _state["lib"] is not None else None


def loaded() -> bool:
    return _state["lib"] is not None


def why() -> str | None:
    """Why the kernel is not in use (None when it is, or was never tried)."""
    return _state["why"]


def set_enabled(on: bool) -> bool:
    """Route small products to the kernel (True) or all to OpenBLAS (False), for
    side-by-side benchmarks in one process; returns the previous setting."""
    lib = _state["lib"]
    return bool(lib.mlxspec_gemm_enable(int(on))) if lib is not None else False


def set_draft_amx(on: bool) -> bool | None:
    """A draft's int8 products over several rows on AMX tiles (True, the default where
    granted) or on VNNI (False), for side-by-side benchmarks; the previous setting, None
    without AMX.  The integer sums are the same either way, so the products are too."""
    lib = _state["lib"]
    old = int(lib.mlxspec_draft_amx(int(on))) if lib is not None else -1
    return None if old < 0 else bool(old)


def enabled() -> bool:
    lib = _state["lib"]
    return lib is not None and bool(lib.mlxspec_gemm_enabled())


def calls() -> int:
    """Products the kernel has computed in this process (0 when not loaded)."""
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_calls()) if lib is not None else 0


def pool() -> tuple[int, int]:
    """(threads, parallel loops run) of the kernels' one thread pool (cpu/thread_pool.c), the caller's
    thread counted; (0, 0) when not loaded."""
    lib = _state["lib"]
    return (int(lib.mlxspec_pool_threads()), int(lib.mlxspec_pool_loops())) if lib is not None else (0, 0)


def packed_calls() -> int:
    """Products on packed weights (cpu/packed_weights.py) in this process."""
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_packed_calls()) if lib is not None else 0


def formats() -> int:
    """The packed weight formats the kernel reads (bits: 1 float32, 2 float16, 4 bfloat16, 8 a draft's int8); 0 when not loaded."""
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_formats()) if lib is not None else 0


def elementwise() -> int:
    """The element-wise operations the kernel computes (bit 1: SwiGLU, cpu/layers.py); 0 when not loaded."""
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_elementwise()) if lib is not None else 0


def max_rows() -> int:
    lib = _state["lib"]
    return int(lib.mlxspec_gemm_max_rows()) if lib is not None else 0
