import os
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
# cost-model calibrations of the tests' throw-away models go to a temp folder, not the user's
# cache; one made here is removed when the session ends (one given in the environment is kept)
CALIBRATION_TMP = None
if "MLXSPEC_CALIBRATION_DIR" not in os.environ:
    CALIBRATION_TMP = tempfile.mkdtemp(prefix="mlxspec-calibration-")
    os.environ["MLXSPEC_CALIBRATION_DIR"] = CALIBRATION_TMP

# calibrations are cached whatever else runs on the machine, except in test_machine_load.py,
# which tests the limit with real load
os.environ["MLXSPEC_BUSY_CORES"] = "inf"

# A suite started as a background job of a non-interactive shell (`cmd &` in a script) gets SIGINT
# ignored, and every child would inherit that: the Ctrl-C tests send their children SIGINT as a
# terminal would, so they take it as a user's process does.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import mlxspec  # noqa: E402,F401  (preloads OpenBLAS before mlx.core)
import pytest  # noqa: E402

import tiny_models  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    """After every fixture's teardown (servers stopped): nothing writes calibrations any more."""
    if CALIBRATION_TMP:
        shutil.rmtree(CALIBRATION_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory):
    """A tiny qwen2 target and a noisy copy of it as draft, as model folders."""
    root = tmp_path_factory.mktemp("tiny")
    cfg = tiny_models.config_for("qwen2")
    target = tiny_models.build(cfg, seed=0, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.01, seed=1)
    t = tiny_models.save_model_dir(root / "target", "qwen2", model=target)
    d = tiny_models.save_model_dir(root / "draft", "qwen2", model=draft)
    return t, d


@pytest.fixture(scope="session")
def tiny_pair(tiny_pair_dirs):
    return mlxspec.load(*tiny_pair_dirs)


@pytest.fixture(scope="session")
def smollm2_pair():
    """The real SmolLM2-135M drafting for itself (it has no smaller partner)."""
    return mlxspec.load("smollm2-135m", "smollm2-135m")
