#!/bin/bash
# perf profile of the draft's compiled forward at widths 1 and 2: ./profile_widths.sh ROWS_SHOWN FORWARDS (22 300)
cd "$(dirname "$0")/../../.."  # the repository
for w in 1 2; do
  .venv/bin/python benchmarks/records/2026-12-06-stop54/one_width.py $w $2 > /tmp/ow$w.log 2>&1 & P=$!
  while ! grep -q GO /tmp/ow$w.log; do sleep 0.5; done
  perf record -F 2000 -o /tmp/perf$w.data -p $P 2>/dev/null >/dev/null & R=$!
  wait $P; kill -INT $R; wait $R
  cat /tmp/ow$w.log | tail -1
  perf report -i /tmp/perf$w.data --no-children --sort dso,sym -F sample,dso,sym --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -$1 | awk -v n=$2 '{printf "%8.1f  %s %s %s\n", $1/n, $2, $3, $4}' | cut -c1-120
done
