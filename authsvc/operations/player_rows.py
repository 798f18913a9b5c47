"""``authsvc player import``: rows from CSV or JSON lines, the username rule, the progress bar.

A bad row raises RowError naming its line, so the admin command prints one line
and the import writes nothing (docs/admin.md).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

from authsvc.errors import Invalid
from authsvc.names import MAX_USERNAME, check_username, check_visible
from authsvc.web.authenticate import parse_user_id

__all__ = ["MAX_USERNAME", "RowError", "check_username", "check_visible", "import_rows"]


class RowError(Invalid):
    pass


def import_rows(data: bytes) -> Iterator[tuple[int, str]]:
    """(user_id, username) rows from CSV or JSON lines; a bad row raises RowError with its line
    number."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RowError(f"the file is not UTF-8 (byte {e.start})") from None
    if text.lstrip()[:1] == "{":
        yield from _json_rows(text)
    else:
        yield from _csv_rows(text)


def _row(line_no: int, raw_user_id, username) -> tuple[int, str]:
    user_id = parse_user_id(str(raw_user_id)) if type(raw_user_id) in (str, int) else None
    if user_id is None:
        raise RowError(f"line {line_no}: user_id must be a whole number from 1 to 2^63-1")
    if type(username) is not str:
        raise RowError(f"line {line_no}: username must be a string")
    try:
        return user_id, check_username(username)
    except Invalid as e:
        raise RowError(f"line {line_no}: {e}") from None


def _json_rows(text: str) -> Iterator[tuple[int, str]]:
    # Lines end at \n only: str.splitlines() would also split at U+2028 and friends inside a name.
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (
            ValueError,
            RecursionError,
        ):  # RecursionError: nested deeper than Python's stack allows
            raise RowError(f"line {line_no}: not a JSON object") from None
        if not isinstance(obj, dict) or "user_id" not in obj or "username" not in obj:
            raise RowError(f"line {line_no}: needs the fields user_id and username")
        yield _row(line_no, obj["user_id"], obj["username"])


def _csv_rows(text: str) -> Iterator[tuple[int, str]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except (
            csv.Error
        ) as e:  # a field over csv.field_size_limit() (131,072 characters), a stray NUL
            raise RowError(f"line {reader.line_num}: not valid CSV ({e})") from None
        line_no = reader.line_num
        if not fields:
            continue
        if line_no == 1 and [f.strip().lower() for f in fields] == ["user_id", "username"]:
            continue  # header
        if len(fields) != 2:
            raise RowError(
                f"line {line_no}: expected 2 fields (user_id,username), got {len(fields)}"
            )
        yield _row(line_no, fields[0].strip(), fields[1])
