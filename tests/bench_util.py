"""Loading a script of benchmarks/ as a module, for the tests of what it computes."""

import importlib.util
from pathlib import Path


def load_benchmark(stem: str):
    """benchmarks/<stem>.py, imported under the name bench_<stem>."""
    path = Path(__file__).parents[1] / "benchmarks" / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
