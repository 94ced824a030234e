"""mlx-lm's open-files limit, made harmless.

Importing `mlx_lm.utils` (which every `import mlx_lm...` does, through the package's
`__init__`) runs `resource.setrlimit(resource.RLIMIT_NOFILE, (2048, 4096))`. Where the
hard limit is below 4096 (`ulimit -Hn 1024`) an unprivileged process may not raise it,
so that line raised ValueError and every mlxspec command that loads a model crashed;
where the hard limit is above 4096 it lowered it for good, and a soft limit above 2048
was lowered too.

`install()` (run by `import mlxspec`, before anything imports mlx_lm) adds an import
hook that runs `mlx_lm.utils` with `resource.setrlimit` standing in for what mlx-lm
wants: the soft open-files limit raised to 2048 as far as the hard limit allows, never
lowered, and the hard limit left as it is. Only that one module's import is affected;
the hook removes itself once it has run (or if mlx_lm was imported before mlxspec).
"""

from __future__ import annotations

import importlib.machinery
import resource
import sys
from contextlib import contextmanager

MODULE = "mlx_lm.utils"
WANTED_SOFT = 2048


def raise_soft_limit(wanted: int = WANTED_SOFT) -> tuple[int, int]:
    """Raise the soft open-files limit towards `wanted`, within the hard limit; never
    lower either. Returns the limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@contextmanager
def tolerant_setrlimit():
    """While in the block, `resource.setrlimit(RLIMIT_NOFILE, ...)` raises the soft limit
    as far as allowed (raise_soft_limit) instead; other limits pass through."""
    real = resource.setrlimit

    def setrlimit(which, limits):
        if which != resource.RLIMIT_NOFILE:
            return real(which, limits)
        resource.setrlimit = real  # raise_soft_limit's own call
        try:
            raise_soft_limit(int(limits[0]))
        finally:
            resource.setrlimit = setrlimit

    resource.setrlimit = setrlimit
    try:
        yield
    finally:
        resource.setrlimit = real


class _Finder:
    """A meta-path finder for `mlx_lm.utils` alone: the real spec, its module run
    under `tolerant_setrlimit`."""

    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        uninstall()
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            with tolerant_setrlimit():
                run(module)

        spec.loader.exec_module = exec_module
        return spec


_FINDER = _Finder()


def install() -> None:
    """Add the hook, unless mlx_lm.utils is imported already. Idempotent."""
    if MODULE not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass
