"""Run by tests/test_distributed.py under `mlx.launch --backend ring -n 2` (not a test module).

Rank 0 decodes with the target sharded over both ranks and compares each result with the
same target decoded whole in this process (single-process plain decoding); it prints one
JSON line.  Rank 1 only follows.  argv: TARGET_DIR DRAFT_DIR [exit|kill]: rank 1 vanishes after the checks"""

import json
import os
import sys
import time

import mlxspec
from mlx.utils import tree_flatten
from mlxspec.api import make_decoder
from mlxspec.costs.cost_model import assumed
from mlxspec.distributed import from_launch
from mlxspec.models.memory import local_tensors, model_bytes

target, draft = sys.argv[1], sys.argv[2]
how = sys.argv[3] if len(sys.argv) > 3 else None  # exit (status 0: mlx.launch stops no one) or kill (-9)
DIE = 1000  # rank 0's sign, after the checks, that rank 1 is to vanish now
shard = from_launch()
pair = mlxspec.load(target, draft, shard=shard)
held = sum(v.nbytes for _, v in tree_flatten(pair.target.parameters()))  # this rank's share of the target
if shard.rank:
    receive = shard.channel.receive

    def receive_or_die():  # the failure check: this rank vanishes mid-run, when rank 0 says
        m = receive()
        if m == [DIE]:
            os._exit(0) if how == "exit" else os.kill(os.getpid(), 9)
        return m

    shard.channel.receive = receive_or_die
    shard.follow(pair.target)
    sys.exit(0)

whole = mlxspec.load(target, draft)
prompt = "w1 w2 w3 w4 w5 w1 w2"
N = 24
cases = {  # name: (make_decoder kwargs, sampling)
    "greedy_chain": (dict(num_draft=4, tree=False), {}),
    "greedy_tree": (dict(num_draft="auto", tree=True, cost=assumed(0.05, slope=0.0, width=40)), {}),
    "seeded_chain": (dict(num_draft=3, tree=False), dict(temp=0.9, seed=7)),
    "seeded_tree": (dict(num_draft="auto", tree=True, cost=assumed(0.05, slope=0.0, width=40)), dict(temp=0.9, seed=7)),
}


def tokens(p, kw, sampling):
    dec = make_decoder(p, **kw)
    out = mlxspec.generate(p, prompt, max_tokens=N, decoder=dec, **sampling)
    return out, dec


report = {"rank": shard.rank, "size": shard.size, "mode": shard.mode, "target_bytes_held": held,
          "target_bytes_whole": model_bytes(local_tensors(target), float_bytes=4)}
for name, (kw, sampling) in cases.items():
    plain = tokens(whole, dict(num_draft=0), sampling)[0].tokens
    out, dec = tokens(pair, kw, sampling)
    st = out.stats
    report[name] = {"equal": plain == out.tokens, "n": len(out.tokens), "plain": plain, "sharded": out.tokens,
                    "accepted": st.draft_accepted,
                    "tree_nodes": st.tree_nodes, "tree_depth": st.tree_depth,
                    "mirrored": type(dec.target).__name__}
if how is not None:  # keep decoding after rank 1 is gone: the error must end this run
    shard.channel.send([DIE])
    t0 = time.time()
    try:
        while time.time() - t0 < 60:
            tokens(pair, dict(num_draft=4, tree=False), {})
        report["failure"] = "no error within 60 s"
    except mlxspec.MlxspecError as e:
        report["failure"] = str(e)
        report["failure_after_s"] = round(time.time() - t0, 2)
report["messages"] = shard.channel.stats()
print(json.dumps(report), flush=True)
