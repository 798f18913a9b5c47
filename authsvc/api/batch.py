"""``POST /v1/players/batch``: up to 1,000 players in one call, a result per item
(docs/admin-api.md, "Many players at once: the batch").

Each item is checked alone, with the rules of ``PUT /v1/players/{user_id}`` (authsvc/names.py): an
invalid item gets its own problem naming its fields (``/players/3/username``) and the valid ones
are written anyway, like Kratos' and Firebase's batch imports. The valid items are written in ONE
transaction with ONE audit record (``player.batch``: the counts and ``sealed_body_sha256``, the
SHA-256 of the canonical request body with its names sealed: sealed_digest), and only the rows that
change are written: the current rows are read under the writer lock (store/writes.py) and the
changed ones written in one statement, so each item's status is exact
(authsvc/operations/players.py's batch_players).

``dry_run`` reads the same rows and answers the same statuses, writing nothing and no record.
A batch that changes nothing writes no record either, as a PUT that changes nothing.
"""

from __future__ import annotations

from typing import cast

from authsvc.api.problems import from_error, invalid
from authsvc.errors import Invalid
from authsvc.names import MAX_ID, check_username
from authsvc.operations.players import STATUSES, Item

MAX_ITEMS = 1000
# Any batch of 1,000 valid players fits, even 255-character names sent as \\u escapes (12 bytes a
# character outside the BMP): the route's body cap instead of AUTHSVC_MAX_BODY_BYTES.
MAX_BYTES = 4 << 20


def parse(body: dict | None) -> tuple[list[Item], dict[int, dict], bool]:
    """(valid items, {index: error result} of the invalid ones, dry_run); 422 for the envelope
    itself."""
    players = None if body is None else body.get("players")
    if not isinstance(players, list) or not 1 <= len(players) <= MAX_ITEMS:
        raise invalid(
            "/players", f"must be a list of 1 to {MAX_ITEMS:,} players (send more in several calls)"
        )
    dry_run = False if body is None else body.get("dry_run", False)
    if type(dry_run) is not bool:
        raise invalid("/dry_run", "must be true or false")
    items: list[Item] = []
    errors: dict[int, dict] = {}
    first: dict[int, int] = {}  # user id -> the index that names it first
    for index, raw in enumerate(players):
        item, faults = _item(index, raw)
        if item is not None and item.user_id in first:
            faults = [
                (
                    f"/players/{index}/user_id",
                    f"appears earlier in this batch (index {first[item.user_id]})",
                )
            ]
        if faults:
            user_id = raw.get("user_id") if isinstance(raw, dict) else None
            valid_id = type(user_id) is int and 1 <= user_id <= MAX_ID
            errors[index] = _error(index, user_id if valid_id else None, faults)
        elif item is not None:
            first[item.user_id] = index
            items.append(item)
    return items, errors, dry_run


def _item(index: int, raw: object) -> tuple[Item | None, list[tuple[str, str]]]:
    where = f"/players/{index}"
    if not isinstance(raw, dict):
        return None, [(where, "must be a JSON object")]
    faults = []
    user_id, username, enabled = raw.get("user_id"), raw.get("username"), raw.get("enabled", True)
    if type(user_id) is not int or not 1 <= user_id <= MAX_ID:
        faults.append((f"{where}/user_id", "must be a whole number from 1 to 2^63-1"))
    if type(username) is not str:
        faults.append(
            (f"{where}/username", "is required" if "username" not in raw else "must be a string")
        )
    else:
        try:
            check_username(username)
        except Invalid as e:  # the names rule, in the command's words
            faults.append((f"{where}/username", str(e)))
    if type(enabled) is not bool:
        faults.append((f"{where}/enabled", "must be true or false"))
    if faults:
        return None, faults
    return Item(index, cast(int, user_id), cast(str, username), enabled), []


def _error(index: int, user_id: int | None, faults: list[tuple[str, str]]) -> dict:
    detail = "; ".join(f"{field}: {text}" for field, text in faults)
    error = Invalid(detail, errors=[{"field": f, "detail": d} for f, d in faults])
    return {
        "index": index,
        "user_id": user_id,
        "status": "error",
        "error": from_error(error).body(),
    }


def results(
    items: list[Item], errors: dict[int, dict], status: dict[int, str]
) -> tuple[list[dict], dict]:
    """The per-item results in the request's order, and the count of each status."""
    out: list[dict] = [{}] * (len(items) + len(errors))
    for item in items:
        out[item.index] = {
            "index": item.index,
            "user_id": item.user_id,
            "status": status[item.user_id],
        }
    for index, error in errors.items():
        out[index] = error
    counts = dict.fromkeys(STATUSES, 0)
    for result in out:
        counts[result["status"]] += 1
    return out, counts
