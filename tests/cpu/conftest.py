"""Tests of the Linux CPU accelerator (mlxspec/cpu/): every test here is marked
`linux_cpu`, so `pytest -m "not linux_cpu"` leaves the suite that holds on any
backend (Metal, or the CPU with MLXSPEC_CPU_KERNELS=0)."""

import pytest


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.fspath).startswith(here + "/"):
            item.add_marker(pytest.mark.linux_cpu)
