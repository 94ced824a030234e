#!/usr/bin/env bash
# One command from a fresh clone:
#   ./setup.sh demo   set up, fetch the default pair, run a real speculative generation
#                     on a code prompt and print acceptance rate and speed-up over plain decoding
#   ./setup.sh test   set up, fetch the small real test model, run the whole test suite
#   ./setup.sh        set up only
# Set-up: Debian's OpenBLAS and a C compiler when running as root on Linux (optional:
# without OpenBLAS everything works, ~10x slower on the CPU backend; without a compiler,
# ~1.5x slower, see mlxspec/small_gemm.py), a virtual environment in .venv,
# and this package with its test extras (`./setup.sh test` also installs Debian's
# chromium as root, for the browser test of `mlxspec serve`'s chat page).
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY_CHECK=.venv/bin/python || PY_CHECK=$PY
"$PY_CHECK" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { echo "mlxspec needs Python 3.10 or newer, and $PY_CHECK is $("$PY_CHECK" -V 2>&1 || echo 'not found') (macOS's own python3 is 3.9): install one (brew install python@3.12, or python.org's installer), then run PYTHON=python3.12 ./setup.sh$([ "$PY_CHECK" = .venv/bin/python ] && echo ' after rm -rf .venv')" >&2; exit 1; }

if [ "$(uname -s)" = "Linux" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null \
   && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3 >/dev/null 2>&1; then
  echo "== installing OpenBLAS (libopenblas0-pthread)"
  (apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1 \
   || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1)) \
   || echo "   could not install OpenBLAS; continuing with MLX's bundled BLAS (slower)"
fi

if [ "$(uname -s)" = "Linux" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null \
   && ! command -v cc >/dev/null; then
  echo "== installing a C compiler (gcc: mlxspec builds its small-batch matmul kernel on first use)"
  (apt-get install -y -q gcc >/dev/null 2>&1 \
   || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q gcc >/dev/null 2>&1)) \
   || echo "   could not install gcc; OpenBLAS will take every product (slower decoding)"
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
echo "== installing mlxspec and its dependencies into .venv"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e ".[test,serve]" > .venv/pip-install.log 2>&1 \
  || { cat .venv/pip-install.log; echo "pip install failed (log: .venv/pip-install.log)"; exit 1; }
.venv/bin/python -c "import mlxspec, mlx.core" || { echo "installation failed"; exit 1; }

case "${1:-}" in
  demo)
    .venv/bin/mlxspec pull
    .venv/bin/mlxspec generate --compare --max-tokens 96 \
      --prompt "Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation."
    ;;
  test)
    # the chat page of `mlxspec serve` is tested in a real headless browser (skipped without one)
    if [ "$(uname -s)" = "Linux" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null \
       && ! command -v chromium >/dev/null; then
      echo "== installing chromium (for the chat page's browser test)"
      (apt-get install -y -q chromium >/dev/null 2>&1 \
       || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
       || echo "   could not install chromium; the browser test will be skipped"
    fi
    .venv/bin/mlxspec pull smollm2-135m
    shift || true
    # two processes (pytest-xdist: 583 s against 1019 s in one, CI here); MLXSPEC_TEST_WORKERS=0 for one, N for N
    .venv/bin/python -m pytest -q --durations=15 -n "${MLXSPEC_TEST_WORKERS:-2}" "$@"
    ;;
  "") ;;
  *) echo "usage: ./setup.sh [demo|test [pytest args]]"; exit 2 ;;
esac
