"""Teacher-forced agreement of the compiled draft with the target's greedy output, for one
revision:  ROOT=<a checkout of mlxspec> python agreement.py
For each code prompt: the target's greedy 64 tokens (plain decoding), then the compiled
draft fed that output one token at a time; printed per prompt: how many of the draft's
top tokens equal the target's, out of how many, and the smallest gap (in logits) between
the draft's top two scores along the way (a near-tie that float32 rounding can flip)."""
import os, sys, json
sys.path.insert(0, os.environ["ROOT"])
import mlxspec, mlx.core as mx, numpy as np
from mlxspec import api
from mlxspec.bench import encode, load_suite, select_prompts
pair = mlxspec.load()
res = {}
for p in select_prompts([load_suite("code")], 0):
    ids = encode(pair.tokenizer, p)
    out = [t for t, _ in mlxspec.make_decoder(pair, "none").generate(list(ids), max_tokens=64, eos_token_ids=pair.tokenizer.eos_token_ids)]
    d = api.make_drafter(pair); st = d.state
    d.prefill(ids)
    hist = list(ids); agree = 0; margins = []
    for t in out:
        lg = st.forward(st.sync(hist))[-1]
        lg = np.array(lg)
        top = int(lg.argmax()); s = np.sort(lg)
        if d.subset is not None: top = int(d.subset.ids[top])
        agree += top == t; margins.append(float(s[-1] - s[-2]))
        hist.append(t)
    res[p.key] = (agree, len(out), round(float(np.min(margins)), 4))
print(os.environ["ROOT"], res)
