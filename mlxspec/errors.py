"""User-facing errors: each one prints as a single actionable line in the CLI."""

import errno


class MlxspecError(Exception):
    """An error the user can act on; its message is one line saying what to do."""


def write_failure(e: BaseException) -> str | None:
    """The reason, if `e` is a failed file write (a full disk, a file-size limit, a read-only
    folder), else None.  MLX reports a failed write as RuntimeError('[write] ...')."""
    if isinstance(e, OSError):
        reason = e.strerror or str(e) or type(e).__name__
        reason += f" ({e.filename})" if e.strerror and e.filename else ""
        full = e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    elif isinstance(e, RuntimeError) and str(e).startswith("[write]"):
        reason, full = str(e)[len("[write]"):].strip() or "write failed", True
    else:
        return None
    return f"{reason} (is the disk full?)" if full else reason
