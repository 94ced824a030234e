"""Checking a Session's settings when they are given, not when a reply is asked for.

`Session(max_tokens=0)` or `Session(temp=-1)` fails at construction (before any
model is loaded) with one line naming the setting, as `--max-tokens 0` does on
the command line.  The errors are also ValueErrors, for callers that catch those.
"""

from __future__ import annotations

from ..errors import MlxspecError
from ..core.options import check
from ..core.sampling import SamplingParams

ON_CANCEL = ("keep", "drop")
NO_TEMPLATE_SYSTEM = "system needs the chat template (drop chat_template=False)"  # as generate's --system-prompt
_UNSET = object()


class SessionSettingError(MlxspecError, ValueError):
    """A Session setting out of range or of the wrong type."""


def check_options(*, pair=None, model=_UNSET, draft=_UNSET, max_tokens=_UNSET, num_draft=_UNSET, p_min=_UNSET,
                  on_cancel=_UNSET, system=_UNSET, drafting=_UNSET, max_kv_size=_UNSET,
                  chat_template=_UNSET) -> None:
    """Raise a one-line MlxspecError (also a ValueError) for the first bad value among
    those given; numbers by core/options.py's rules, the CLI's."""
    if pair is not None and (model not in (_UNSET, None) or draft not in (_UNSET, None)):
        raise SessionSettingError("give a loaded pair or model=/draft=, not both")
    if max_tokens is None:
        raise SessionSettingError("max_tokens must be a whole number >= 1, got None")
    for name, value in (("max_tokens", max_tokens), ("num_draft", num_draft), ("p_min", p_min),
                        ("max_kv_size", max_kv_size)):
        if value is not _UNSET:
            check(name, value)
    if on_cancel is not _UNSET and on_cancel not in ON_CANCEL:
        raise SessionSettingError(f"on_cancel must be 'keep' or 'drop', got {on_cancel!r}")
    if system is not _UNSET and system is not None and not isinstance(system, str):
        raise SessionSettingError(f"system must be text or None, got {type(system).__name__}")
    if drafting is not _UNSET and drafting is not None and not isinstance(drafting, bool):
        raise SessionSettingError(f"drafting must be True or False, got {drafting!r}")
    if chat_template is not _UNSET and not isinstance(chat_template, bool):
        raise SessionSettingError(f"chat_template must be True or False, got {chat_template!r}")
    if chat_template is False and system not in (_UNSET, None, ""):
        raise SessionSettingError(NO_TEMPLATE_SYSTEM)


def sampling_params(base, changes: dict) -> SamplingParams:
    """`base` (a SamplingParams, a dict of its fields, or None) with `changes`
    applied, checked: an unknown name or a value out of range is one line.  A string `base`
    is the sampling method ("coupled" or "rejection": `Session(sampling="coupled")`, as the API's
    `sampling=`)."""
    if isinstance(base, str):
        base = {"sampling": base}
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
