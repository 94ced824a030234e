#!/bin/sh
# Where a compiled draft step's time goes, per thread: the default draft's forward over one position, again
# and again (step_loop.py's loop, 30 s), sampled by perf at 1000 Hz for 15 s once it is warm; the top
# symbols of each thread that was busy.  Needs perf (linux-perf) and the pair pulled.
#     sh profile.sh [TREE]          # TREE: the checkout to time (default: this repository)
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
TREE=${1:-$(cd "$HERE/../../.." && pwd)}
OUT=$(mktemp -d)
PYTHONPATH=$TREE HERE=$HERE python - > "$OUT/loop.out" 2>&1 <<'PYEOF' &
import os, statistics, sys
sys.path.insert(0, os.environ["HERE"])
from step_loop import timed
times = timed(30, ready=lambda: print("READY", os.getpid(), flush=True))
print(f"steps {len(times)}, median {statistics.median(times) * 1e3:.2f} ms", flush=True)
PYEOF
until grep -q READY "$OUT/loop.out" 2>/dev/null; do sleep 0.5; done
PID=$(awk '/READY/ {print $2}' "$OUT/loop.out")
perf record -F 1000 -g -p "$PID" -o "$OUT/perf.data" -- sleep 15 2> /dev/null
wait
tail -1 "$OUT/loop.out"
echo "samples per thread (1000 Hz for 15 s), then each busy thread's top symbols:"
perf script -i "$OUT/perf.data" -F tid,ip,sym,dso 2> /dev/null | awk '
    /^ *[0-9]+ *$/ {tid = $1; n[tid]++; take = 1; next}
    take && NF > 0 {s = $2; for (i = 3; i <= NF; i++) s = s " " $i; c[tid " | " s]++; take = 0}
    END {for (t in n) print n[t], "thread", t; for (k in c) if (c[k] >= 150) print c[k], "|", k}' | sort -rn | cut -c1-150
rm -rf "$OUT"
