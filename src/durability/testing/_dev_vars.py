"""Secrets for local development: a ``.dev.vars`` file, read as wrangler reads it.

Lives here: the parser of the dotenv format that ``wrangler dev`` uses for
``.dev.vars`` (``KEY=value`` lines; ``#`` comments; values in single, double
or back quotes, which may span lines; ``\\n`` in double quotes is a newline;
an optional ``export`` before the key).
Must not know: the runtime or the server; it turns text into a dict.
"""

from __future__ import annotations

import re
from pathlib import Path

_ENTRY = re.compile(
    r"""^[ \t]*(?:export[ \t]+)?(?P<key>[\w.-]+)[ \t]*[=:][ \t]*
        (?:(?P<quote>['"`])(?P<quoted>.*?)(?P=quote)[ \t]*(?:\#[^\n]*)?
          |(?P<bare>[^\n]*?))[ \t]*$""",
    re.MULTILINE | re.DOTALL | re.VERBOSE,
)


def parse_dev_vars(text: str) -> dict[str, str]:
    """The ``KEY=value`` entries of a dotenv text; a later key wins, lines
    that are no entry (comments, blank lines) are skipped."""
    values: dict[str, str] = {}
    for match in _ENTRY.finditer(text.replace("\r\n", "\n")):
        if match.group("quote") is not None:
            value = match.group("quoted")
            if match.group("quote") == '"':
                value = value.replace("\\n", "\n").replace("\\r", "\r")
        else:
            value = match.group("bare").split(" #", 1)[0].strip()
            if value.startswith("#"):
                value = ""
        values[match.group("key")] = value
    return values


def load_dev_vars(path: Path) -> dict[str, str] | None:
    """The entries of the file at ``path``, or None when there is none."""
    if not path.is_file():
        return None
    return parse_dev_vars(path.read_text(encoding="utf-8"))
