"""Errors a user (or a site admin) can cause: one line, exit status 2, no traceback."""

import re

# what str.splitlines() breaks on, the other control characters a terminal would act on (C0, DEL, C1: 0x9b is a
# CSI on some terminals), the marks that reorder text on screen (bidi controls), and the lone surrogates that stand
# for bytes of a file name that are not UTF-8 (printing one raises UnicodeEncodeError)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


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
    """``text`` on one line, safe for a terminal: a file name or value holding a newline, a terminal escape or a
    control character is shown escaped (ESC as \\x1b). THE filter for whatever hpcvod prints that came from a
    user, a job folder or a scheduler."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)  # "\n" -> "\\n", ESC -> "\\x1b"
