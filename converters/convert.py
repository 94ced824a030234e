"""`mlxspec convert`: a target/draft pair from the Hub -> one pair folder.

1. resolve both repos to commits; fetch configs and tokenizer files only;
   refuse an incompatible pair (mlxspec.models.tokenizer_compat: llama.cpp's rules, padding tolerant);
2. budget memory from the safetensors headers (range requests, no tensor bytes)
   plus both KV caches; refuse before any weight is downloaded when over budget;
   check free disk space for the download and the output;
3. download the safetensors weights into the HF cache (resumable: finished files
   stay cached), convert / quantise each model with mlx-lm, and write

     DIR/pair.json   DIR/target/   DIR/draft/

   atomically: everything goes to a hidden temp folder beside DIR, renamed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from mlxspec.models import memory
from mlxspec.util import tempfiles, untrusted
from mlxspec.drafting import vocab_subset
from mlxspec.errors import MlxspecError, write_failure
from mlxspec.util.untrusted import printable, read_json
from mlxspec.models.model_files import load_tokenizer as load_tokenizer_safely

from . import hub

QUANTIZE_CHOICES = ("4", "8", "none")
DEFAULT_CONTEXT = memory.DEFAULT_CONTEXT
NOT_COPIED = {"config.json", hub.INDEX_FILE}


# ---------------------------------------------------------------- choices


def default_quantize() -> tuple[str, str]:
    """(choice, why): 4-bit on Metal, none on the CPU backend (float32 compute)."""
    from mlxspec.device import is_gpu

    if is_gpu():
        return "4", "default on Metal"
    return "none", "default on the CPU backend, which computes in float32; --quantize 4 for 4-bit"


def quantize_bits(choice: str) -> int | None:
    if choice not in QUANTIZE_CHOICES:
        raise MlxspecError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {choice!r}")
    return None if choice == "none" else int(choice)


def default_output(target: str, draft: str) -> Path:
    return Path.cwd() / f"{target.rstrip('/').split('/')[-1]}+{draft.rstrip('/').split('/')[-1]}"


# ---------------------------------------------------------------- checks


def read_config(r: hub.Repo, snapshot: Path) -> dict:
    from mlxspec.models.model_files import CONFIG_MAX_BYTES

    config = read_json(snapshot / "config.json", f"{r.repo}/config.json", CONFIG_MAX_BYTES)
    memory.check_config(config, f"{r.repo}/config.json")
    if config.get("model_file"):
        raise MlxspecError(f"{r.repo} needs custom model code ({printable(config['model_file'])}), "
                           "which mlxspec never runs")
    try:
        from mlx_lm.utils import _get_classes

        _get_classes(config)
    except (ValueError, KeyError, ImportError) as e:
        import mlx_lm

        raise MlxspecError(
            f"{r.repo}: model type {printable(repr(config.get('model_type')))} is not supported by mlx-lm "
            f"{mlx_lm.__version__}"
        ) from e
    return config


def source_bits(r: hub.Repo, config: dict) -> int | None:
    """Bits of an MLX-quantised source repo, None if unquantised; refuses other formats."""
    q = memory.text_config(config).get("quantization")
    if isinstance(q, dict) and q.get("bits"):
        return int(q["bits"])
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        method = printable(qc.get("quant_method", "unknown"))
        raise MlxspecError(f"{r.repo} is pre-quantised ({method}); convert from the unquantised repo instead")
    return None


def load_tokenizer(r: hub.Repo, snapshot: Path, config: dict):
    """mlx-lm's tokenizer wrapper from a folder of tokenizer and config files (no custom code)."""
    return load_tokenizer_safely(snapshot, config.get("eos_token_id"), f"the tokenizer of {r.repo}", label=r.repo)


def check_pair(target: hub.Repo, draft: hub.Repo, tsnap: Path, dsnap: Path, tcfg: dict, dcfg: dict):
    from mlxspec.models.tokenizer_compat import check_tokenizers

    ttok = load_tokenizer(target, tsnap, tcfg)
    dtok = load_tokenizer(draft, dsnap, dcfg)
    rows = [memory.text_config(c).get("vocab_size") for c in (tcfg, dcfg)]
    comp = check_tokenizers(ttok, dtok, *rows)
    if not comp.ok:
        raise MlxspecError(f"{draft.repo} cannot draft for {target.repo}: {comp.reason}")
    return comp, dtok


def remote_tensors(r: hub.Repo, names, config: dict) -> list:
    header: dict = {}
    for name in names:
        header.update(hub.safetensors_header(r, name))
    return memory.from_header(header, config)


def check_disk(downloads: int, cache: Path, output: int, out_parent: Path) -> None:
    """Refuse when the HF cache or the output folder's disk lacks room."""

    def free_at(p: Path):
        while not p.exists():
            p = p.parent
        st = os.stat(p)
        return shutil.disk_usage(p).free, st.st_dev

    cache_free, cache_dev = free_at(cache)
    out_free, out_dev = free_at(out_parent)
    if cache_dev == out_dev and downloads + output > cache_free:
        raise MlxspecError(
            f"not enough disk space: {memory.fmt_bytes(downloads)} to download into {cache} and "
            f"{memory.fmt_bytes(output)} to write to {out_parent}, but only {memory.fmt_bytes(cache_free)} free there"
        )
    if downloads > cache_free:
        raise MlxspecError(f"not enough disk space: {memory.fmt_bytes(downloads)} to download into {cache}, "
                           f"only {memory.fmt_bytes(cache_free)} free (set HF_HOME to a bigger disk)")
    if output > out_free:
        raise MlxspecError(f"not enough disk space: {memory.fmt_bytes(output)} to write to {out_parent}, "
                           f"only {memory.fmt_bytes(out_free)} free (pass -o on a bigger disk)")


# ---------------------------------------------------------------- converting


def convert_model(src: Path, dst: Path, bits: int | None) -> dict:
    """An mlx-lm model folder at `dst` from the HF snapshot `src`, quantised to `bits` if given."""
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    model, config = load_model(src, lazy=True, trust_remote_code=False)
    config = untrusted.strip_code_refs(config)
    if bits:
        model, config = quantize_model(model, config, memory.GROUP_SIZE, bits)
    save_model(dst, model, donate_model=True)
    save_config(config, config_path=dst / "config.json")
    for f in sorted(src.iterdir()):
        if hub.is_meta(f.name) and f.name not in NOT_COPIED:
            copy_meta(f, dst / f.name)
    return config


def copy_meta(src: Path, dst: Path) -> None:
    """Copy a tokenizer/config file; JSON objects lose `auto_map` (the pair never names code to run)."""
    if src.suffix == ".json":
        try:
            data = untrusted.read_json(src, str(src))
        except MlxspecError:
            data = None
        clean = untrusted.strip_code_refs(data)
        if clean is not data:
            dst.write_text(json.dumps(clean, indent=2, ensure_ascii=False) + "\n")
            return
    shutil.copyfile(src, dst)


def manifest(target: hub.Repo, draft: hub.Repo, quantize: str, comp, budget: memory.Budget) -> dict:
    import mlxspec

    return {
        "format": "mlxspec-pair",
        "version": 1,
        "target": {"path": "target", "repo": target.repo, "revision": target.revision},
        "draft": {"path": "draft", "repo": draft.repo, "revision": draft.revision},
        "quantization": quantize,
        "compatibility": comp.to_dict(),
        "memory": budget.to_dict(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mlxspec_version": mlxspec.__version__,
    }


def convert_pair(target: str, draft: str, out: str | Path | None = None, quantize: str | None = None,
                 context: int = DEFAULT_CONTEXT, budget_gb: float | None = None, revision: str | None = None,
                 draft_revision: str | None = None, log=print) -> Path:
    """The whole pipeline; returns the pair folder.  Raises MlxspecError (one line) on any refusal."""
    from mlxspec.device import describe, is_gpu

    if context <= 0:
        raise MlxspecError(f"--context must be positive, got {context}")
    asked = quantize is not None
    quantize, why = (quantize, "as asked") if asked else default_quantize()
    bits = quantize_bits(quantize)
    out = Path(out).expanduser().absolute() if out else default_output(target, draft)
    out_note = "" if out != default_output(target, draft) else " (default: <target>+<draft> here; -o to change)"
    if out.exists():
        raise MlxspecError(f"{out} already exists; remove it or choose another folder with -o")
    log(f"mlxspec convert: {target} drafted by {draft}")
    log(f"backend: {describe()}")
    log(f"quantisation: {quantize} ({why})")
    log(f"output: {out}{out_note}")

    log(f"[1/4] resolving on {hub.endpoint()}{' (offline: cache only)' if hub.offline() else ''}")
    repos = []
    for label, name, rev in (("target", target, revision), ("draft", draft, draft_revision)):
        r = hub.resolve(name, rev)
        hub.check_safetensors(r)
        snap = hub.download(r, hub.meta_files(r))
        config = read_config(r, snap)
        sbits = source_bits(r, config)
        if sbits and asked and bits != sbits:
            raise MlxspecError(f"{r.repo} is already {sbits}-bit; pass --quantize {sbits} (or omit --quantize)")
        names = hub.weight_files(r, snap)
        size = sum(r.files.get(n) or 0 for n in names)
        log(f"  {label:<6} {r.short}  {len(names)} weight file(s), {memory.fmt_bytes(size)}"
            f"{f', already {sbits}-bit' if sbits else ''}")
        repos.append((r, snap, config, names, sbits))
    (tr, tsnap, tcfg, tnames, tbits), (dr, dsnap, dcfg, dnames, dbits) = repos

    log("[2/4] tokenizers")
    comp, dtok = check_pair(tr, dr, tsnap, dsnap, tcfg, dcfg)
    log(f"  {comp.reason}")

    log(f"[3/4] memory at a {context}-token context (from safetensors headers; no weights downloaded yet)")
    tt, dt = remote_tensors(tr, tnames, tcfg), remote_tensors(dr, dnames, dcfg)
    usable, src = memory.usable_bytes(budget_gb)
    float_bytes = None if is_gpu() else 4
    budget = memory.pair_budget(tcfg, dcfg, tt, dt, context=context, quantize_bits=bits,
                                float_bytes=float_bytes, usable=usable, usable_source=src)
    log(budget.table())
    if not budget.fits:
        hint = "--quantize 4, " if bits != 4 and not (tbits and dbits) else ""
        raise MlxspecError(
            f"over budget: the pair needs {memory.fmt_bytes(budget.total)} but {memory.fmt_bytes(usable)} is usable "
            f"({src}); try {hint}a smaller --context, a smaller target, or --budget GiB; nothing was downloaded"
        )

    to_fetch = [(r, n) for r, names in ((tr, tnames), (dr, dnames)) for n in names if hub.cached_path(r, n) is None]
    download_bytes = sum(r.files.get(n) or 0 for r, n in to_fetch)
    out_bytes = memory.model_bytes(tt, bits) + memory.model_bytes(dt, bits)
    check_disk(download_bytes, hub.cache_dir(), out_bytes, out.parent)

    log(f"[4/4] weights: {len(to_fetch)} file(s), {memory.fmt_bytes(download_bytes)} to download into {hub.cache_dir()}")
    hub.download(tr, tnames, downloading=True)
    hub.download(dr, dnames, downloading=True)

    out.parent.mkdir(parents=True, exist_ok=True)
    tempfiles.remove_stale(out.parent, stem=out.name)  # left by a killed earlier run (its process is gone)
    with tempfiles.signals_raise():  # SIGTERM/SIGHUP: the except clauses below remove the temp folder
        tmp = tempfiles.temp_name(out.parent, out.name)
        try:
            tmp.mkdir()
            for label, r, snap, b in (("target", tr, tsnap, tbits), ("draft", dr, dsnap, dbits)):
                log(f"  converting {label} {r.short}" + (f" -> {bits}-bit" if bits and not b else ""))
                convert_model(snap, tmp / label, None if b else bits)
            label = str(tbits) if tbits and tbits == dbits else quantize  # pre-quantised sources keep their bits
            (tmp / "pair.json").write_text(json.dumps(manifest(tr, dr, label, comp, budget), indent=2) + "\n")
            # the draft head's token frequencies (drafting/vocab_subset.py), so the pair needs no counting later
            vocab_subset.write_table(vocab_subset.cached_table(dtok, say=log), tmp / vocab_subset.FILE_NAME)
            if out.exists():
                raise MlxspecError(f"{out} appeared while converting; the new pair was not written")
            os.rename(tmp, out)
        except (OSError, RuntimeError) as e:  # MLX reports a failed write as RuntimeError("[write] ...")
            shutil.rmtree(tmp, ignore_errors=True)
            reason = write_failure(e)
            if reason is None:
                raise
            raise MlxspecError(f"cannot write the pair folder {out}: {reason}; nothing was written") from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log(f"wrote {out} ({memory.fmt_bytes(_du(out))}); use it with mlxspec.load({str(out)!r}) "
        f"or `mlxspec generate --model {out} -p 'Hello'`")
    return out


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
