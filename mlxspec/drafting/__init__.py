"""Who proposes tokens: a draft model, a layer-skipping copy of the target, prompt
lookup and the hybrid of both (drafters, hybrid), the pruned draft head
(vocab_subset) and the drafter names (registry).  May import: costs, models, core
and below.
"""
