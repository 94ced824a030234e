"""Where calibrations are kept: one file per machine, backend, kernel build, pair and
drafter, under the mlxspec home (`MLXSPEC_CALIBRATION_DIR` overrides the folder).

`for_decoder` returns the cached cost model for a decoder, measuring it first
(cost_model.calibrate) when there is none, and caches the result.  One measured while
other programs kept the machine busy (costs/machine_load.py) is off: it is cached only
where nothing better is, marked (`busy`), used by later runs while the machine stays
busy (a minute of calibration on every start would cost more than its error), and
measured again by the first run that finds the machine idle.  A file of another
format, or one that does not parse, is ignored with a note and measured again.
Files are written whole (a temporary file, then a rename), so a killed run never
leaves half a calibration.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

from .cost_model import FORMAT, CostModel, calibrate
from ..errors import MlxspecError
from .machine_load import Watch, describe, idle_now, limit, too_busy
from .verify_curve import as_used, spread_warning
from ..util.untrusted import printable, read_json


def calibration_dir() -> Path:
    env = os.environ.get("MLXSPEC_CALIBRATION_DIR")
    if env:
        return Path(env).expanduser()
    from ..util.paths import cache_dir

    return cache_dir() / "calibration"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _model_identity(path) -> dict | None:
    """What identifies a model folder's weights: its path, config and file sizes."""
    if path is None:
        return None
    p = Path(path)
    try:
        files = sorted((f.name, f.stat().st_size) for f in p.glob("*.safetensors"))
        config = hashlib.sha256((p / "config.json").read_bytes()).hexdigest()[:16]
    except OSError:
        return None
    return {"path": str(p.resolve()), "config": config, "weights": files}


def cache_key(pair, drafter) -> str | None:
    """A key for this machine + backend + pair + drafter; None when the models have
    no folder to identify them (built in memory): those are not cached."""
    from ..device import describe
    from .. import cpu

    target = _model_identity(getattr(pair, "target_path", None))
    if target is None:
        return None
    draft = None
    if getattr(drafter, "uses_draft_model", False):
        draft = _model_identity(getattr(pair, "draft_path", None))
        if draft is None:
            return None
    ident = {"format": FORMAT, "backend": describe(), "cpu": _cpu_name(), "cores": os.cpu_count(),
             "machine": platform.machine(), "target": target, "draft": draft,
             "drafter": getattr(drafter, "cost_key", drafter.name),
             **cpu.signature(pair, draft is not None)}  # the CPU accelerator's state: kernel, layout, ...
    from ..device import model_dtype

    dtype = model_dtype(getattr(pair, "target", None))
    if dtype not in (None, "float32"):  # --dtype float16 / bfloat16 (float32 keeps the keys it had)
        ident["dtype"] = dtype
    sharded = getattr(getattr(pair, "target", None), "mlxspec_sharding", None)
    if sharded:  # a target split over mlx.launch's ranks (distributed/): its passes carry their messages
        ident["sharded"] = sharded
    tcfg = getattr(pair, "target_config", None) or {}
    if isinstance(tcfg.get("mlxspec"), dict) and isinstance(tcfg.get("quantization"), dict):
        ident["bits_at_load"] = tcfg["quantization"].get("bits")  # Metal's 4-bit load (models/metal_4bit.py)
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


MAX_FILE_BYTES = 64 << 10  # a calibration is about 2 KB
MAX_WIDTHS = 64  # entries in a width list (32 verify widths and 16 draft widths are measured)
MAX_RELATIVE = 1000.0  # a pass or draft step costs at most this many plain target steps
MAX_STEP_S = 3600.0


def _number(d: dict, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    v = d[key] if isinstance(d, dict) else d
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo < v if lo_open else lo <= v) or not v <= hi:
        raise ValueError(f"values out of range: {key} is {v!r}, expected a number in "
                         f"{'(' if lo_open else '['}{lo:g}, {hi:g}]")
    return float(v)


def _widths(d: dict, key: str, required: bool) -> list[float]:
    v = d[key] if required else d.get(key, [])
    if not isinstance(v, list) or len(v) > MAX_WIDTHS or (required and not v):
        n = len(v) if isinstance(v, list) else type(v).__name__
        raise ValueError(f"values out of range: {key} has {n} entries, expected 1 to {MAX_WIDTHS}")
    return [_number(x, f"{key}[{i}]", 0, MAX_RELATIVE, lo_open=True) for i, x in enumerate(v)]


def read(path: Path, fmt: int | None = FORMAT) -> CostModel:
    """The cost model in a calibration file (OSError, ValueError, KeyError, TypeError or
    MlxspecError when it is not one; of format `fmt`, or of any with None).  Every value
    is range-checked: finite, not negative, at most MAX_RELATIVE plain steps, width lists
    of at most MAX_WIDTHS entries (an inf silently turns drafting off; a million-entry
    list makes every token slower)."""
    d = read_json(path, str(path), MAX_FILE_BYTES)
    if not isinstance(d, dict):
        raise ValueError(f"a JSON {type(d).__name__}, not a calibration")
    if fmt is not None and d.get("format") != fmt:
        raise ValueError(f"format {printable(repr(d.get('format')), 40)}")
    cm = CostModel(_number(d, "draft_step", 0, MAX_RELATIVE), _widths(d, "verify", True),
                   _number(d, "plain_step_s", 0, MAX_STEP_S), "cached", _widths(d, "draft_widths", False))
    if d.get("busy") is not None:  # measured while other programs kept this many cores busy (machine_load.py)
        cm.busy = _number(d, "busy", 0, 1 << 16)
    if isinstance(d.get("dips_real"), bool):  # Metal: whether the curve's dips reproduced (verify_curve.as_used)
        cm.dips_real = d["dips_real"]
    if cm.verify[0] != 1.0:
        raise ValueError(f"values out of range: verify[0] is {cm.verify[0]!r}, expected 1.0")
    return cm


def load_cached(key: str, warn=None) -> CostModel | None:
    path = calibration_dir() / f"{key}.json"
    if not path.exists():
        return None
    try:
        return read(path)
    except (OSError, ValueError, KeyError, TypeError, MlxspecError) as e:
        if warn is not None:
            warn(f"note: ignoring the calibration file {path} ({str(e).splitlines()[0] if str(e) else type(e).__name__}); measuring again")
        return None


def save(key: str, cm: CostModel) -> None:
    folder = calibration_dir()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"format": FORMAT, **cm.to_dict()}, indent=1))
        os.replace(tmp, folder / f"{key}.json")
    except BaseException:  # a full disk, or Ctrl-C: no temp file left behind, per run
        tmp.unlink(missing_ok=True)
        raise


def _vocab_rows(pair) -> int:
    """Ids every model of the pair can embed (the synthetic context must stay inside both tables)."""
    if getattr(pair, "vocab_size", None):
        return int(pair.vocab_size)
    cfg = getattr(pair, "target_config", None) or {}
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size") or 1000)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_NOTED: set = set()  # keys whose calibration measured under load this process has said it uses


def for_decoder(pair, drafter, *, refresh: bool = False, say=_stderr) -> CostModel:
    """The cached cost model for (pair, drafter), measured now when there is none
    (or `refresh`).  Without a draft model (prompt lookup) only the verify passes
    are measured; the drafter's own `relative_cost` stands for its step.  Returned as
    the rules use it: with the small-batch kernel the verify curve never falls
    (costs/verify_curve.py); the cache keeps the figures as measured."""
    key = cache_key(pair, drafter)
    limit()  # a bad MLXSPEC_BUSY_CORES is refused before anything is measured or read
    cached = None if key is None else load_cached(key, warn=say)
    cm = None if refresh else cached
    if cm is not None:
        if not too_busy(cm.busy):
            return as_used(cm)
        if not idle_now():  # measured under load and still busy: use it rather than pay a minute every start
            if say is not None and key not in _NOTED:  # once per process (bench builds a decoder per run)
                _NOTED.add(key)
                say(f"note: using a calibration measured while {describe(cm.busy)}; it is measured again once "
                    "the machine is idle (or run `mlxspec calibrate` then)")
            return as_used(cm)
        if say is not None:
            say("note: the cached calibration was measured under load and the machine is idle now: measuring again")
    vocab = _vocab_rows(pair)
    if key is not None and say is not None:
        say("calibrating the draft and verify costs on this machine (once per pair; `mlxspec calibrate` to redo)")
    with Watch() as watch:
        cm = calibrate(pair.target, drafter, vocab)
    cm.busy = watch.others
    note = spread_warning(cm) if watch.others is None else None  # no /proc load figure (not Linux): say so from the repeats
    if note and say is not None:
        say(note)
    if watch.busy():  # its prices are off (costs/machine_load.py): kept, marked, only where nothing better is cached
        keep = key is not None and (cached is None or (too_busy(cached.busy) and cm.busy < cached.busy))
        if say is not None:
            say(f"note: {watch.describe()} while calibrating: "
                + ("these costs are kept, marked as measured under load, and measured again once the machine is "
                   "idle" if keep else "these costs serve this run only; the calibration cached before is kept")
                + " (or run `mlxspec calibrate` when the machine is idle)")
        if keep:
            try:
                save(key, cm)
            except OSError:
                pass
        return as_used(cm)
    if key is not None:
        try:
            save(key, cm)
        except OSError as e:
            if say is not None:
                say(f"note: could not save the calibration ({e}); it will be measured again next time")
    return as_used(cm)  # the file keeps the figures as measured
