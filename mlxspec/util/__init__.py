"""Plumbing every layer may use: where mlxspec keeps its files (paths), private
folders for compiled code (private_dirs), crash-safe temporary files (tempfiles),
progress lines, the open-files limit, a Ctrl-C held while the command starts
(startup_signals), and input we do not trust (untrusted: printable names, bounded
JSON, confined paths).  Imports only errors.
"""
