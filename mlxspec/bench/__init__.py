"""The side-by-side benchmark as a library: prompt suites (prompts), contenders
(contenders), the interleaved runner (runner), figures and reports (figures,
report), `--compare` (compare) and the draft-length advisor (advisor).  The
`bench` command is commands/bench.py.  May import: api and below.
"""
