"""Checking a Session's settings when they are given, not when a reply is asked for.

`Session(max_tokens=0)` or `Session(temp=-1)` fails at construction (before any
model is loaded) with one line naming the setting, as `--max-tokens 0` does on
the command line.  The errors are also ValueErrors, for callers that catch those.
"""

from __future__ import annotations

import math

from .errors import MlxspecError
from .sampling import SamplingParams

MAX_NUM_DRAFT = 16  # as `--num-draft`
ON_CANCEL = ("keep", "drop")
_UNSET = object()


class SessionSettingError(MlxspecError, ValueError):
    """A Session setting out of range or of the wrong type."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_options(*, pair=None, model=_UNSET, draft=_UNSET, max_tokens=_UNSET, num_draft=_UNSET, p_min=_UNSET,
                  on_cancel=_UNSET, system=_UNSET, drafting=_UNSET) -> None:
    """Raise SessionSettingError for the first bad value among those given."""
    if pair is not None and (model not in (_UNSET, None) or draft not in (_UNSET, None)):
        raise SessionSettingError("give a loaded pair or model=/draft=, not both")
    if max_tokens is not _UNSET and not (_is_int(max_tokens) and max_tokens >= 1):
        raise SessionSettingError(f"max_tokens must be a whole number of at least 1, got {max_tokens!r}")
    if num_draft is not _UNSET and num_draft not in (None, "auto") and not (
            _is_int(num_draft) and 0 <= num_draft <= MAX_NUM_DRAFT):
        raise SessionSettingError(f"num_draft must be 'auto' or a whole number from 0 to {MAX_NUM_DRAFT}, "
                                  f"got {num_draft!r}")
    if p_min is not _UNSET and not (isinstance(p_min, (int, float)) and not isinstance(p_min, bool)
                                    and math.isfinite(p_min) and 0 <= p_min <= 1):
        raise SessionSettingError(f"p_min must be a probability from 0 to 1, got {p_min!r}")
    if on_cancel is not _UNSET and on_cancel not in ON_CANCEL:
        raise SessionSettingError(f"on_cancel must be 'keep' or 'drop', got {on_cancel!r}")
    if system is not _UNSET and system is not None and not isinstance(system, str):
        raise SessionSettingError(f"system must be text or None, got {type(system).__name__}")
    if drafting is not _UNSET and drafting is not None and not isinstance(drafting, bool):
        raise SessionSettingError(f"drafting must be True or False, got {drafting!r}")


def sampling_params(base, changes: dict) -> SamplingParams:
    """`base` (a SamplingParams, a dict of its fields, or None) with `changes`
    applied, checked: an unknown name or a value out of range is one line."""
    if base is not None and not isinstance(base, (SamplingParams, dict)):
        raise SessionSettingError(f"sampling must be a SamplingParams or a dict, got {type(base).__name__}")
    fields = base.to_dict() if isinstance(base, SamplingParams) else dict(base or {})
    fields.update(changes)
    known = set(SamplingParams.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise SessionSettingError(f"unknown setting {unknown[0]!r} (sampling settings: {', '.join(sorted(known))})")
    try:
        return SamplingParams(**fields)
    except MlxspecError as e:
        raise SessionSettingError(str(e)) from None
    except (TypeError, ValueError) as e:
        raise SessionSettingError(" ".join(str(e).split())) from None
