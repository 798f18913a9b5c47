"""Usernames and game names that show on screen as what they are (docs/admin.md).

Control (Cc), format (Cf: bidi overrides and isolates, zero-width characters, the
byte-order mark, the soft hyphen), line and paragraph separator (Zl, Zp) and lone
surrogate (Cs) characters are invisible or move text around them: a name holding
one can look like another name, or reorder the line of admin output it is printed
in. New names may not hold them; names stored before that rule are printed with
each such character escaped. JSON output escapes them by itself.
"""

from __future__ import annotations

import unicodedata

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def hidden_character(name: str) -> str | None:
    """'U+202E at position 3' for the first hidden character of ``name`` (1-based), else None.

    Names the code point, never the character itself, so the error line cannot lie either.
    """
    for position, char in enumerate(name, start=1):
        if unicodedata.category(char) in HIDDEN_CATEGORIES:
            return f"U+{ord(char):04X} at position {position}"
    return None


def shown(name: str) -> str:
    """``name`` for text output: each hidden character written as an escape such as ``\\u202e``."""
    if not any(unicodedata.category(char) in HIDDEN_CATEGORIES for char in name):
        return name
    return "".join(_escape(char) if unicodedata.category(char) in HIDDEN_CATEGORIES else char for char in name)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
