"""The benchmark scripts check where they will write before any slow work: a
missing folder is made (as `mlxspec bench --out` does), and an --out that cannot be
written is one line and exit 1, not a traceback at the end of a 20-minute run (as
revision_ab.py did when its folder was missing)."""

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def revision_ab(out, cwd) -> subprocess.CompletedProcess:
    # an unknown base: the script stops at the export, the first slow step, right after checking --out
    return subprocess.run([sys.executable, str(BENCHMARKS / "revision_ab.py"), "--base", "no-such-revision",
                           "--out", str(out)], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_a_missing_folder_is_made_before_the_work(tmp_path):
    out = tmp_path / "not" / "yet" / "ab.json"
    r = revision_ab(out, tmp_path)
    assert out.parent.is_dir()
    assert r.returncode == 1 and "no-such-revision" in r.stderr and "Traceback" not in r.stderr


def test_an_out_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    for out, says in ((tmp_path / "a-file" / "ab.json", "cannot make its folder"), (tmp_path, "is a folder")):
        r = revision_ab(out, tmp_path)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0 and says in r.stderr and "no-such-revision" not in r.stderr
