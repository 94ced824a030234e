"""One switch turns the Linux CPU accelerator off (mlxspec/cpu/switches.py):
with MLXSPEC_CPU_KERNELS=0 no kernel is built or loaded, no weight is packed,
transposed or rounded, no layer slimmed or fused and no draft forward compiled,
whatever the mechanisms' own variables say; OpenBLAS (a real library) stays.
And nothing outside mlxspec/cpu/ reaches past its door (cpu/__init__.py)."""

import ast
from pathlib import Path

import pytest

import mlxspec
from tiny_models import loaded_elsewhere

PACKAGE = Path(mlxspec.__file__).parent
PROBE = ("from mlxspec import cpu; from mlxspec.cpu import kernel, layers, compiled_forward, fused_projections, "
         "blas_layout")
WORDS = "cpu.layout(m).replace(' ', '-'), bool(layers.applied(m)), kernel.loaded(), compiled_forward.wanted(), fused_projections.wanted()"


def test_one_switch_turns_every_part_off(tmp_path):
    off = loaded_elsewhere(tmp_path / "off", {"MLXSPEC_CPU_KERNELS": "0"}, PROBE, WORDS)
    assert off == ["mlx", "False", "False", "False", "False"]
    why = loaded_elsewhere(tmp_path / "why", {"MLXSPEC_CPU_KERNELS": "0"}, PROBE, "repr(kernel.why())")
    assert "MLXSPEC_CPU_KERNELS=0" in " ".join(why)


@pytest.mark.linux_cpu  # the accelerator at work: Linux only
def test_the_switch_is_what_turns_it_off(tmp_path):
    """The control: without the switch, the same probe sees the accelerator at work
    (where this machine can build the kernel)."""
    on = loaded_elsewhere(tmp_path / "on", {}, PROBE, WORDS)
    assert on[0] != "mlx" and on[1] == "True" and on[3] == "True"


def test_nothing_outside_cpu_imports_its_internals():
    inside = PACKAGE / "cpu"
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if inside in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                if mod.lstrip(".").startswith("cpu.") or ".cpu." in mod or mod.endswith(".cpu.") \
                        or (mod.lstrip(".") == "cpu" and any(a.name not in ("__init__",) and (inside / f"{a.name}.py").exists()
                                                            for a in node.names)):
                    offenders.append(f"{path.relative_to(PACKAGE)}: {mod}")
    assert offenders == []
