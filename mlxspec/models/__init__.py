"""Getting a pair onto the machine: where a spec points (locate), loading and the
pair (loading), checks before anything large is read (model_files, memory,
pair_check, tokenizer_compat), recurrent-state memory, GGUF conversion (gguf/)
and the pinned demo and test weights (pinned/).  May import: core and below.
"""
