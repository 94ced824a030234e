"""The small-batch matmul kernel (cpu/kernel.py, cpu/small_gemm.c): it takes the
decode-sized products on the CPU backend, computes them right (against float64,
every shape class the tiling has: edges, strides, transposes, alpha/beta), each
row exactly as it would alone, a calibration belongs to its state, and without a
compiler, with a broken one or turned off, OpenBLAS takes every call and nothing
is left behind."""

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxspec import device as backend
from mlxspec.costs import calibration as calibration_cache
from mlxspec.cpu import kernel as small_gemm

pytestmark = pytest.mark.skipif(not small_gemm.loaded(), reason=f"kernel not loaded: {small_gemm.why()}")
ROOT = Path(__file__).resolve().parents[2]


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 7 * len(shape) + sum(shape)).standard_normal(shape).astype(np.float32)


def test_loaded_and_named_in_the_backend_line():
    assert small_gemm.enabled() and "small-batch kernel)" in backend.describe()
    old = small_gemm.set_enabled(False)
    try:
        assert "small-batch kernel off" in backend.describe()
    finally:
        small_gemm.set_enabled(old)


def test_takes_decode_sized_products_only():
    w = mx.array(rand(64, 96))
    before = small_gemm.calls()
    mx.eval(mx.array(rand(3, 64)) @ w)
    assert small_gemm.calls() == before + 1
    mx.eval(mx.array(rand(small_gemm.max_rows() + 1, 64)) @ w)  # prefill-sized: OpenBLAS
    assert small_gemm.calls() == before + 1


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 16, 31, 32])
@pytest.mark.parametrize("k,n", [(1, 1), (17, 7), (300, 64), (64, 100), (257, 200), (40, 1000)])
def test_products_match_float64(m, k, n):
    a, b, c = rand(m, k, seed=1), rand(k, n, seed=2), rand(m, n, seed=3)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64) + 1e-3
    bt = mx.array(np.ascontiguousarray(b.T))
    before = small_gemm.calls()
    got = {
        "x @ w": mx.array(a) @ mx.array(b),
        "x @ w.T (transposed B)": mx.array(a) @ bt.T,
        "addmm (alpha, beta)": mx.addmm(mx.array(c), mx.array(a), mx.array(b), alpha=0.5, beta=2.0),
        "strided rows of A": (mx.array(np.concatenate([a, a], axis=1))[:, :k]) @ mx.array(b),
    }
    mx.eval(*got.values())
    assert small_gemm.calls() > before
    want = {"addmm (alpha, beta)": 0.5 * ref + 2.0 * c}
    for what, out in got.items():
        err = np.abs(np.array(out, dtype=np.float64) - want.get(what, ref)) / (scale if "addmm" not in what else
                                                                               scale + 2 * np.abs(c))
        assert err.max() < 1e-5, f"{what}: relative error {err.max():.2g}"


@pytest.mark.parametrize("k,n", [(96, 128), (200, 640), (64, 3000)])
@pytest.mark.parametrize("transposed", [False, True])
def test_each_row_is_computed_as_it_would_be_alone(k, n, transposed):
    """Batch invariance: row i of a product over M rows equals, bit for bit, the
    product of row i alone -- so a verify pass scores a position exactly as a plain
    step would.  (OpenBLAS does not promise this: its kernels for 1 and for many
    rows sum in other orders.)"""
    x = mx.array(rand(32, k, seed=4))
    w = mx.array(rand(n, k, seed=5)).T if transposed else mx.array(rand(k, n, seed=5))
    alone = np.concatenate([np.array(x[i:i + 1] @ w) for i in range(32)])
    for m in (2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 20, 32):  # every register tile (1-10 rows), every split
        together = np.array(x[:m] @ w)
        assert np.array_equal(together, alone[:m]), f"{m} rows together differ from each row alone"


def test_calibration_belongs_to_the_kernels_state(tiny_pair_dirs):
    import mlxspec
    from mlxspec.drafting.drafters import ModelDrafter

    pair = mlxspec.load(*tiny_pair_dirs)
    drafter = ModelDrafter(pair.draft)
    key = calibration_cache.cache_key(pair, drafter)
    old = small_gemm.set_enabled(False)
    try:
        assert key is not None and calibration_cache.cache_key(pair, drafter) != key
    finally:
        small_gemm.set_enabled(old)


def _run(env_extra: dict, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLXSPEC_HOME": str(home), **env_extra}
    code = ("import mlxspec, mlx.core as mx; from mlxspec import device as backend; from mlxspec.cpu import kernel as small_gemm;"
            "y = (mx.array([[1.0, 2.0]]) @ mx.array([[3.0], [4.0]])).item();"
            "print(backend.describe()); print(small_gemm.calls(), y)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


@pytest.mark.parametrize("env,why", [({"MLXSPEC_SMALL_GEMM": "0"}, "turned off (MLXSPEC_SMALL_GEMM=0)"),
                                     ({"CC": "/nonexistent/cc"}, "no C compiler"),
                                     ({"CC": "/bin/false"}, "the kernel did not compile")])
def test_openblas_takes_every_call_without_the_kernel(tmp_path, env, why):
    r = _run(env, tmp_path)
    assert r.returncode == 0, r.stderr
    line, counts = r.stdout.splitlines()[-2:]
    assert f"no small-batch kernel: {why}" in line and "OpenBLAS" in line
    assert counts == "0 11.0"
    kernels = tmp_path / "kernels"
    assert not kernels.exists() or not any(p.name.endswith(".tmp") for p in kernels.iterdir())


def test_built_once_into_the_cache_older_builds_and_stale_temps_removed(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = kernels / f".small_gemm-0123456789abcdef.{dead.pid}.a1b2c3.tmp"  # a build killed midway
    stale.write_bytes(b"half a library")
    older = kernels / "small_gemm-00000000deadbeef.so"  # the build of an older source
    older.write_bytes(b"an old build")
    r = _run({}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "small-batch kernel)" in r.stdout and r.stdout.split()[-2] == "1"
    built = sorted(p.name for p in kernels.iterdir())  # the library and its recorded sha256
    assert len(built) == 2 and built[0].startswith("small_gemm-") and built[0].endswith(".so")
    assert built[1] == built[0] + ".sha256"
    mtime = (kernels / built[0]).stat().st_mtime_ns
    assert _run({}, tmp_path).returncode == 0
    assert (kernels / built[0]).stat().st_mtime_ns == mtime  # cached, not built again


def test_the_draft_kernels_check_out_where_the_cpu_has_them():
    """A kernel that computes a format wrongly is not used (draft_weights.works): on a CPU
    with AVX-512 VNNI (and AMX, where Linux grants it) that must not silently happen."""
    from mlxspec.cpu import draft_weights

    flags = small_gemm._cpu_flags().split()
    if not small_gemm.loaded() or "avx512_vnni" not in flags:
        pytest.skip("no AVX-512 VNNI here")
    assert draft_weights.works()
    if "amx_int8" in flags:
        assert small_gemm.set_draft_amx(True) is not None  # granted and in use
