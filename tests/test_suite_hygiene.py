"""The test suite cleans up after itself: a session leaves nothing in the temp folder
(conftest's calibration folder used to be left behind by every run)."""

import os
import subprocess
import sys
from pathlib import Path

INNER = '''
import os


def test_the_calibration_folder_is_a_temp_folder():
    folder = os.environ["MLXSPEC_CALIBRATION_DIR"]
    assert os.path.isdir(folder) and os.path.dirname(folder) == os.environ["TMPDIR"]
    open(os.path.join(folder, "calibration.json"), "w").close()  # as a calibration would
'''


def test_a_session_leaves_the_temp_folder_empty(tmp_path):
    """One test under the suite's conftest (loaded as a plugin), with its own TMPDIR and
    no MLXSPEC_CALIBRATION_DIR: the session makes the folder, and removes it at the end."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "test_inner.py").write_text(INNER)
    tests = str(Path(__file__).parent)
    env = {k: v for k, v in os.environ.items() if k != "MLXSPEC_CALIBRATION_DIR"}
    env.update(TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([tests, env.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                          "--basetemp", str(tmp_path / "basetemp"), "test_inner.py"],
                         cwd=tmp_path / "inner", env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in tmp.iterdir()) == []
