"""Multi-turn conversations on one loaded pair: `Session` (session) keeps the
conversation's caches between turns; a turn's stream (turn), its drafting
(drafting), settings, prompt rendering and totals; saving and loading
conversations (file_format).  May import: api and below.

`from mlxspec.session import Session` is public API.
"""

from .session import CONTEXT_WARN_FRACTION, ContextFullError, Session  # noqa: F401

__all__ = ["ContextFullError", "Session"]
