"""Errors a user (or a site admin) can cause: one line, exit status 2, no traceback."""

import re

# what str.splitlines() breaks on, and the other control characters a terminal would act on
_LINE_BREAKING = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


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


def one_line(text: str) -> str:
    """``text`` on one line: a file name or value holding a newline (or a terminal escape) is shown escaped."""
    return _LINE_BREAKING.sub(lambda m: repr(m.group())[1:-1], text)  # "\n" -> "\\n", ESC -> "\\x1b"
