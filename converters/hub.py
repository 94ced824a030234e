"""Fetching from the Hugging Face Hub with the real `huggingface_hub` client.

Honours HF_ENDPOINT, HF_HOME / HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE like
every other Hugging Face tool.  A repo is resolved once to a commit sha and every
later request names that sha, so configs, headers and weights come from the same
commit.  Weights are safetensors only; pickle checkpoints are refused.

Errors become one-line `MlxspecError`s (see `hub_errors`).
"""

from __future__ import annotations

import errno
import fnmatch
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlxspec.errors import MlxspecError
from mlxspec.util.untrusted import read_json

META_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
    "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json",
    "model.safetensors.index.json",
)
META_PATTERNS = ("*.tiktoken",)
INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
SINGLE_WEIGHTS = re.compile(r"model(-\d+-of-\d+)?\.safetensors")


@dataclass
class Repo:
    """A Hub repo pinned to one commit."""

    repo: str
    revision: str  # the commit sha
    files: dict = field(default_factory=dict)  # name -> size in bytes (None if unknown)
    requested: str = "main"
    offline_dir: Path | None = None  # the cached snapshot, when resolved in offline mode

    @property
    def short(self) -> str:
        return f"{self.repo}@{self.revision[:7]}"


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


# ---------------------------------------------------------------- errors


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _is_network_error(e: BaseException) -> bool:
    names = {"ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException", "NetworkError",
             "ConnectionError", "ProxyError", "ReadError"}
    for x in _chain(e):
        if isinstance(x, (ConnectionRefusedError, TimeoutError)):
            return True
        if any(c.__name__ in names for c in type(x).__mro__) and type(x).__name__ != "OfflineModeIsEnabled":
            return True
    return False


def _is_interrupted(e: BaseException) -> bool:
    for x in _chain(e):
        if type(x).__name__ in ("RemoteProtocolError", "ReadError", "IncompleteRead", "ChunkedEncodingError"):
            return True
        if isinstance(x, OSError) and "Consistency check failed" in str(x):
            return True
    return False


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def explain(e: BaseException, repo: str, revision: str | None = None, downloading: bool = False) -> str | None:
    """A one-line, actionable message for a huggingface_hub / network / disk error, or None."""
    from huggingface_hub import get_token
    from huggingface_hub.utils import (
        EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled,
        RepositoryNotFoundError, RevisionNotFoundError,
    )

    ep = endpoint()
    resume = "; run the same command again to resume (finished files stay in the HF cache)" if downloading else ""
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno == errno.ENOSPC:
            return f"disk full while downloading {repo} ({x.filename or cache_dir()}); free some space{resume}"
    if isinstance(e, GatedRepoError):
        if get_token():
            return f"{repo} is gated and your token has no access to it: request access at {ep}/{repo}"
        return f"{repo} is gated: accept its terms at {ep}/{repo}, then set HF_TOKEN (or run `hf auth login`)"
    if isinstance(e, RevisionNotFoundError):
        return f"revision {revision!r} not found in {repo} on {ep}"
    if isinstance(e, RepositoryNotFoundError):
        return f"repository {repo} not found on {ep} (check the name; a private repo needs HF_TOKEN)"
    if offline() and isinstance(e, (OfflineModeIsEnabled, LocalEntryNotFoundError)):
        return (f"HF_HUB_OFFLINE is set and {repo} is not (fully) in the cache at {cache_dir()}; "
                "unset HF_HUB_OFFLINE to download it")
    if _is_network_error(e):
        what = f"download of {repo} was cut off" if downloading else f"cannot reach the Hub at {ep}"
        tail = resume or "; check your connection, or set HF_HUB_OFFLINE=1 to use files already in the cache"
        return f"{what} ({type(_last(e)).__name__}: {_first_line(_last(e))}){tail}"
    if downloading and _is_interrupted(e):
        return f"download of {repo} was interrupted ({_first_line(_last(e))}){resume}"
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", "?")
        return f"the Hub at {ep} answered {status} for {repo} ({_first_line(e)}){resume or '; try again later'}"
    if isinstance(e, EntryNotFoundError):
        return f"a file is missing from {repo}: {_first_line(e)}"
    return None


def _last(e: BaseException) -> BaseException:
    """The root cause (the deepest exception of the chain)."""
    out = e
    for x in _chain(e):
        out = x
    return out


@contextmanager
def hub_errors(repo: str, revision: str | None = None, downloading: bool = False):
    """Turn huggingface_hub, network and disk errors into one-line MlxspecErrors."""
    try:
        yield
    except MlxspecError:
        raise
    except Exception as e:
        msg = explain(e, repo, revision, downloading)
        if msg is None:
            raise
        raise MlxspecError(msg) from e


# ---------------------------------------------------------------- resolving


def resolve(repo: str, revision: str | None = None) -> Repo:
    """Pin `repo` at `revision` (default main) to a commit and list its files with sizes."""
    requested = revision or "main"
    if offline():
        return _resolve_cached(repo, requested)
    from huggingface_hub import HfApi

    with hub_errors(repo, requested):
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    files = {}
    for s in info.siblings or []:
        size = s.lfs.size if s.lfs is not None else s.size
        files[s.rfilename] = size
    return Repo(repo, info.sha, files, requested)


def _resolve_cached(repo: str, revision: str) -> Repo:
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo, "config.json", revision=revision)
    if not isinstance(path, str):
        raise MlxspecError(
            f"HF_HUB_OFFLINE is set and {repo} ({revision}) is not in the cache at {cache_dir()}; "
            "unset HF_HUB_OFFLINE to download it"
        )
    snap = Path(path).parent
    files = {p.relative_to(snap).as_posix(): p.stat().st_size for p in snap.rglob("*") if p.is_file()}
    return Repo(repo, snap.name, files, revision, offline_dir=snap)


def is_meta(name: str) -> bool:
    return "/" not in name and (name in META_FILES or any(fnmatch.fnmatch(name, p) for p in META_PATTERNS))


def meta_files(r: Repo) -> list:
    names = sorted(n for n in r.files if is_meta(n))
    if "config.json" not in names:
        raise MlxspecError(f"{r.repo} has no config.json: not a transformers model repo")
    return names


def check_safetensors(r: Repo) -> None:
    """Refuse repos without safetensors weights (pickle checkpoints can run code when loaded)."""
    if any(n.endswith(".safetensors") for n in r.files):
        return
    pickles = sorted(n for n in r.files if n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise MlxspecError(
            f"{r.repo} has only pickle weights ({', '.join(pickles[:3])}); mlxspec reads safetensors only "
            "(pickle files can run code when loaded): pick a repo that ships model.safetensors"
        )
    if r.offline_dir is not None:
        raise MlxspecError(f"HF_HUB_OFFLINE is set and the weights of {r.repo} are not in the cache; "
                           "unset HF_HUB_OFFLINE to download them")
    raise MlxspecError(f"{r.repo} has no weights (no *.safetensors file)")


def weight_files(r: Repo, snapshot: Path) -> list:
    """The safetensors files mlx-lm will load: the index's shards, else model*.safetensors."""
    index = snapshot / INDEX_FILE
    if index.is_file():
        try:
            names = sorted(set(read_json(index, f"{r.repo}/{INDEX_FILE}", 64 << 20)["weight_map"].values()))
        except (KeyError, TypeError, AttributeError) as e:
            raise MlxspecError(f"{r.repo}: {INDEX_FILE} is unreadable ({e})") from e
    else:
        names = sorted(n for n in r.files if SINGLE_WEIGHTS.fullmatch(n))
    if not names and r.offline_dir is not None:
        raise MlxspecError(f"HF_HUB_OFFLINE is set and the weights of {r.repo} are not in the cache; "
                           "unset HF_HUB_OFFLINE to download them")
    if not names:
        found = ", ".join(sorted(n for n in r.files if n.endswith(".safetensors"))[:3])
        raise MlxspecError(f"{r.repo} has no model*.safetensors weights for mlx-lm (found: {found})")
    missing = [n for n in names if r.offline_dir is None and n not in r.files]
    if missing:
        raise MlxspecError(f"{r.repo}: {INDEX_FILE} names {missing[0]}, which is not in the repo")
    return names


# ---------------------------------------------------------------- fetching


def cached_path(r: Repo, name: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    p = try_to_load_from_cache(r.repo, name, revision=r.revision)
    return Path(p) if isinstance(p, str) else None


def download(r: Repo, names, downloading: bool = False) -> Path:
    """hf_hub_download each of `names` at the pinned commit; returns the snapshot folder.

    Shows huggingface_hub's progress bars; cached files are not fetched again."""
    from huggingface_hub import hf_hub_download

    snapshot = None
    for name in names:
        with hub_errors(r.repo, r.requested, downloading):
            path = Path(hf_hub_download(r.repo, name, revision=r.revision))
        snapshot = path.parents[len(Path(name).parts) - 1]
    _record_ref(r)
    return snapshot


def _record_ref(r: Repo) -> None:
    """Point the cache's refs/<branch> at the pinned commit (downloads by sha do not),
    so HF_HUB_OFFLINE=1 finds the files later (the documented HF cache layout)."""
    if r.offline_dir is not None or r.requested == r.revision:
        return
    ref = cache_dir() / ("models--" + r.repo.replace("/", "--")) / "refs" / r.requested
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(r.revision)
    except OSError:
        pass  # a read-only cache still works online


def safetensors_header(r: Repo, name: str) -> dict:
    """The JSON header of a safetensors file, reading only its header bytes.

    Cached files are read locally; remote ones with two HTTP range requests
    (the 8-byte length, then the header), so no tensor byte crosses the
    network.  (`HfApi.get_safetensors_metadata` asks for the first 100 kB,
    which for small files is the tensor data too.)"""
    from mlxspec.models.memory import check_header_length, parse_header, read_local_header

    local = r.offline_dir / name if r.offline_dir is not None else cached_path(r, name)
    if local is not None and Path(local).is_file():
        return read_local_header(local)
    with hub_errors(r.repo, r.requested):
        (n,) = _unpack_len(_range(r, name, 0, 8))
        check_header_length(n, f"{r.repo}/{name}")
        return parse_header(_range(r, name, 8, n), f"{r.repo}/{name}")


def _unpack_len(b: bytes):
    import struct

    if len(b) != 8:
        raise MlxspecError("a safetensors file is shorter than 8 bytes")
    return struct.unpack("<Q", b)


def _range(r: Repo, name: str, start: int, length: int) -> bytes:
    """`length` bytes of a remote file from `start`, via an HTTP Range request
    (streamed and cut short, so a server ignoring Range cannot push more)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(r.repo, name, revision=r.revision)
    headers = {**build_hf_headers(), "Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
    session = get_session()
    if hasattr(session, "stream"):  # httpx (huggingface_hub >= 1.0)
        request, chunks = session.stream("GET", url, headers=headers, timeout=30), "iter_bytes"
    else:  # requests (huggingface_hub < 1.0)
        request, chunks = session.get(url, headers=headers, timeout=30, stream=True), "iter_content"
    with request as resp:
        hf_raise_for_status(resp)
        skip = start if resp.status_code == 200 else 0  # Range ignored: skip to `start` ourselves
        out = bytearray()
        for chunk in getattr(resp, chunks)():
            out += chunk
            if len(out) >= skip + length:
                break
    return bytes(out[skip:skip + length])
