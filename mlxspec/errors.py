"""User-facing errors: each one prints as a single actionable line in the CLI."""


class MlxspecError(Exception):
    """An error the user can act on; its message is one line saying what to do."""
