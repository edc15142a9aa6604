"""Errors a user (or a site admin) can cause: one line, exit status 2, no traceback."""


class UserError(Exception):
    """Bad input that the CLI reports as one line (what, where, what was expected) and exit status 2."""


class ProfileError(UserError):
    """A site profile that does not follow the schema; ``key_path`` names the offending key."""

    def __init__(self, key_path: tuple[str | int, ...], message: str, source: str | None = None) -> None:
        self.key_path = key_path
        self.message = message
        self.source = source
        super().__init__(self._format())

    def _format(self) -> str:
        where = format_key_path(self.key_path)
        parts = [p for p in (self.source, where) if p]
        return f"{': '.join(parts)}: {self.message}" if parts else self.message

    def located(self, source: str) -> "ProfileError":
        """The same error, naming the file (and line, when known) it came from."""
        return ProfileError(self.key_path, self.message, source)


def format_key_path(path: tuple[str | int, ...]) -> str:
    """``('partitions', 'gpu', 'max_time')`` -> ``partitions.gpu.max_time``; list indexes as ``[0]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
