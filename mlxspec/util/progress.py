"""Progress bars on stderr for the slow steps: loading, converting, fetching, prompt processing.

One rule for all of them: a bar (tqdm) is drawn only when stderr is a terminal,
and is erased when its step ends, so piped or logged output never holds a bar,
a carriage return or an escape sequence.  `set_enabled(False)` turns bars off
(e.g. `--quiet`), `set_enabled(True)` forces them on, `None` restores the rule.

    with progress.bar("converting model.gguf", total=n, unit="tensor") as b:
        for t in tensors:
            ...
            b.update(1)

Prompt processing (`cache.ModelState.prefill`) reports each chunk through
`prefill(total)`; a prompt that fits in one chunk gets no bar.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

PREFILL_MIN_TOKENS = 512  # prompts shorter than one prefill chunk are quick: no bar
_forced: bool | None = None


def set_enabled(on: bool | None) -> None:
    global _forced
    _forced = on


def enabled() -> bool:
    if _forced is not None:
        return _forced
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):  # closed or replaced by something without a terminal
        return False


class _Off:
    """What `bar` yields when bars are off: the same methods, doing nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass


@contextmanager
def bar(desc: str, total: int | None, unit: str = "it", unit_scale: bool = False, show: bool = True):
    """A progress bar on stderr while the block runs (see the module docstring);
    `show=False` (a caller told to be quiet): none."""
    if not (show and enabled()):
        yield _Off()
        return
    import shutil

    from tqdm import tqdm

    # tqdm asks the terminal for its size and draws nothing when told 0 or -1 (a fresh pty,
    # a serial console): COLUMNS/LINES, else the terminal's size, else 80 x 24
    size = shutil.get_terminal_size((80, 24))
    b = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr, leave=False,
             ncols=size.columns, nrows=size.lines, mininterval=0.25, smoothing=0.3)
    try:
        yield b
    finally:
        b.close()


@contextmanager
def prefill(total: int):
    """`report(n)` after each chunk of `n` prompt tokens: a 'processing the prompt'
    bar (tokens done / total, tok/s) when the prompt is long enough to need one."""
    if total < PREFILL_MIN_TOKENS or not enabled():
        yield _ignore
        return
    with bar("processing the prompt", total, unit="tok") as b:
        yield b.update


def _ignore(n: int = 1) -> None:
    pass
