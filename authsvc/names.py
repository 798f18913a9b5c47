"""Usernames and game names that show on screen as what they are (docs/admin.md).

Control (Cc), format (Cf: bidi overrides and isolates, zero-width characters, the
byte-order mark, the soft hyphen), line and paragraph separator (Zl, Zp) and lone
surrogate (Cs) characters are invisible or move text around them: a name holding
one can look like another name, or reorder the line of admin output it is printed
in. New names may not hold them; names stored before that rule are printed with
each such character escaped. JSON output escapes them by itself.

The rules for new names and ids live here, shared by the admin command, the
operations layer and the player import: each raises Invalid.
"""

from __future__ import annotations

import unicodedata

from authsvc.errors import Invalid

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def hidden_character(name: str) -> str | None:
    """'U+202E at position 3' for the first hidden character of ``name`` (1-based), else None.

    Names the code point, never the character itself, so the error line cannot lie either.
    """
    if (
        name.isprintable()
    ):  # no hidden character: each of their categories is one str.isprintable refuses
        return None
    for position, char in enumerate(name, start=1):
        if unicodedata.category(char) in HIDDEN_CATEGORIES:
            return f"U+{ord(char):04X} at position {position}"
    return None


MAX_USERNAME = 255
MAX_GAME_NAME = 200
MAX_ID = 2**63 - 1  # user ids and game ids: both engines' signed 64-bit integers


def check_visible(what: str, name: str) -> None:
    """Refuse a new name holding a character that is invisible or reorders text."""
    found = hidden_character(name)
    if found:
        raise Invalid(f"{what} must not contain control, format or separator characters ({found})")


def check_username(name: str) -> str:
    check_visible("username", name)
    if not name.strip() or name != name.strip():
        raise Invalid("username must not be empty or start or end with white space")
    if len(name) > MAX_USERNAME:
        raise Invalid(f"username must be at most {MAX_USERNAME} characters")
    return name


def check_game_name(name: str) -> str:
    """The name to store: surrounding white space dropped, 1 to 200 printable characters."""
    check_visible("game name", name)
    name = name.strip()
    if not name or len(name) > MAX_GAME_NAME:
        raise Invalid(f"game name must be 1 to {MAX_GAME_NAME} printable characters")
    return name


def check_user_id(user_id: int) -> int:
    """The user-id rule of docs/api.md: a whole number from 1 to 2^63-1."""
    if type(user_id) is not int or not 1 <= user_id <= MAX_ID:
        raise Invalid(f"user id must be a whole number from 1 to 2^63-1, got {user_id!r}")
    return user_id


def check_game_id(game_id: int) -> int:
    if type(game_id) is not int or not 1 <= game_id <= MAX_ID:
        raise Invalid(f"game id must be a positive whole number, got {game_id!r}")
    return game_id


def shown(name: str) -> str:
    """``name`` for text output: each hidden character written as an escape such as ``\\u202e``."""
    if not any(unicodedata.category(char) in HIDDEN_CATEGORIES for char in name):
        return name
    return "".join(
        _escape(char) if unicodedata.category(char) in HIDDEN_CATEGORIES else char for char in name
    )


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
