"""The exact core of speculative decoding: sampling parameters and logits processing
(sampling), the acceptance rule (acceptance), a model's caches and their one
rollback rule `sync(history)` (cache, kv_window, recurrent), statistics (stats),
token-id checks (token_ids) and the rules every user-set number obeys (options).
May import: errors, util, arch, cpu (through its door), device.
"""
