"""Reading the audit trail: ``authsvc audit`` (list), ``audit verify`` (the chain), ``audit prune``.

The records and the chain are written by the store (authsvc/store/audit.py); this
module walks the chain to name the first record that was altered, removed or
inserted, prints records one a line (names as docs/admin.md shows them), and
parses the TIME of ``--since`` and ``--before`` (docs/admin.md, "The audit trail").
It also sends the command's head lines (the chain's head after each committed write,
store/audit.py's HEAD_LOG) to the journal: ``heads_logged``.

Verify also checks what is kept beside the chain (docs/admin.md, "Erasure"): each
username kept in clear must be the one its record's digest seals under the player's key;
sealed names may be gone only for a player whose deletion a later record holds; and a
record written before sealing whose names a deletion erased must be, as it now is, what
that deletion's record lists.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import logging
import logging.handlers
import os
import re
import sys
from collections.abc import Iterable, Iterator

from authsvc import times
from authsvc.errors import Invalid
from authsvc.names import MAX_ID, shown
from authsvc.operations import audit as audit_ops
from authsvc.operations.context import admin_store, command_context
from authsvc.store.audit import ERASED, HEAD_LOG, PERSONAL, Chain, Record, seal

DAY_MS = 86_400_000
_AGO = re.compile(r"(\d{1,6})([dhm])")
_UNIT_MS = {"d": DAY_MS, "h": 3_600_000, "m": 60_000}


def parse_time(text: str, now_ms: int) -> int:
    """TIME as unix milliseconds: an ISO 8601 date or date and time (UTC unless it says otherwise),
    or a span before now: ``30d``, ``12h``, ``90m``."""
    if m := _AGO.fullmatch(text.strip()):
        return now_ms - int(m[1]) * _UNIT_MS[m[2]]
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise Invalid(
            "a time must be a date or date and time (2026-11-01, 2026-11-01T12:00:00Z) or a span "
            f"ago (30d, 12h, 90m), got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return round(when.timestamp() * 1000)


def utc(ms: int) -> str:
    return times.utc(ms, millis=False, sep=" ")


# -- the command's head lines -------------------------------------------------------------------

JOURNAL_SOCKET = "/dev/log"  # syslog's socket: journald reads it on a systemd host


class _Journal(logging.handlers.SysLogHandler):
    """syslog's socket, as ``authsvc``; a line the journal did not take goes to stderr, never lost
    silently."""

    def handleError(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr, flush=True)


@contextlib.contextmanager
def heads_logged() -> Iterator[None]:
    """While the command runs, its head lines (``authsvc.audit: head id=N hash=H``, docs/logs.md) go
    to the journal through syslog's socket where there is one (any systemd host, also under sudo),
    else to stderr: the command's own log (a container's, a test's). The admin API's go to
    gunicorn's error log instead (deploy/gunicorn.conf.py). Nothing else of the command is
    logged."""
    handler: logging.Handler
    if os.path.exists(JOURNAL_SOCKET):
        handler = _Journal(JOURNAL_SOCKET)
        handler.ident = "authsvc: "
        handler.append_nul = False
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    level, propagate = HEAD_LOG.level, HEAD_LOG.propagate
    HEAD_LOG.addHandler(handler)
    HEAD_LOG.setLevel(logging.INFO)
    HEAD_LOG.propagate = False
    try:
        yield
    finally:
        HEAD_LOG.removeHandler(handler)
        HEAD_LOG.setLevel(level)
        HEAD_LOG.propagate = propagate
        handler.close()


# -- verify ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    records: int
    first_id: int  # where the chain starts: the record after the prune anchor
    head_id: int
    head_hash: str  # kept elsewhere, it shows a later rewrite of the whole chain (docs/admin.md)
    problem: str | None = None  # names the first record altered, removed or inserted
    record_id: int | None = None


# A head line as store/audit.py logs it (HEAD_LOG, HEAD_LINE), after whatever the log put before it:
# gunicorn's prefix (time, process, level), journalctl's (time, host, "authsvc[PID]:"), or nothing
# (journalctl -o cat).
_LOGGED = re.compile(rf"(?:^|\s){re.escape(HEAD_LOG.name)}: (.*)")
_HEAD = re.compile(r"head id=([1-9][0-9]{0,18}) hash=([0-9a-f]{64})")


def read_heads(path: str) -> dict[int, set[str]]:
    """The heads a log anchors, {record id: its hashes} (one, unless the chain was written twice
    from there): from each line of the logger ``authsvc.audit``; every other line is skipped.
    Invalid for a line of that logger that is not a head line as authsvc writes it, and for a file
    without one."""
    heads: dict[int, set[str]] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if (logged := _LOGGED.search(line)) is None:
                    continue
                head = _HEAD.fullmatch(logged[1].rstrip())
                if head is None or int(head[1]) > MAX_ID:
                    raise Invalid(
                        f"{path} line {number}: not a head line as authsvc writes it "
                        f"('{HEAD_LOG.name}: head id=N hash=H', N from 1 to 2^63-1, H 64 "
                        f"lower-case hex digits): {shown(line.strip()[:200])!r}"
                    )
                heads.setdefault(int(head[1]), set()).add(head[2])
    except OSError as e:
        raise Invalid(f"cannot read the anchor file {path}: {e.strerror}") from None
    if not heads:
        raise Invalid(
            f"{path} holds no head line ('{HEAD_LOG.name}: head id=N hash=H'): give the log of the "
            'admin command and the admin API (docs/admin.md, "Anchoring the head in the journal")'
        )
    return heads


def verify(items: Iterable[Chain | Record], anchors: dict[int, set[str]] | None = None) -> Verdict:
    """Walk the chain (the audit_chain row, then the records oldest first) to its head; with
    ``anchors`` (read_heads), also check that the chain holds each head the log anchors after the
    chain's start, the newest one included: nothing was cut from the end, even with the head row
    moved to match."""
    anchors = anchors or {}
    it = iter(items)
    chain = next(it)
    if not isinstance(chain, Chain):
        raise TypeError("verify() takes the audit_chain row first (Store.audit_walk)")
    expected, prev, count = chain.anchor_id + 1, chain.anchor_hash, 0
    last_prune: Record | None = None
    erased: dict[
        int, tuple[str, int, int | None]
    ] = {}  # record id -> (its hash now, erased by, user id)
    unnamed: dict[
        int, int
    ] = {}  # user id -> the first record whose sealed names are gone, awaiting its deletion
    beside: tuple[int, str] | None = (
        None  # the first problem of what is kept beside the chain: named last
    )

    def bad(record_id: int, problem: str) -> Verdict:
        return Verdict(
            count, chain.anchor_id + 1, chain.head_id, chain.head_hash, problem, record_id
        )

    for r in it:
        if not isinstance(r, Record):
            raise TypeError("verify() takes records after the audit_chain row (Store.audit_walk)")
        if r.id > chain.head_id:
            return bad(
                r.id, f"record {r.id} was inserted: the chain ends at record {chain.head_id}"
            )
        if r.id < expected:
            return bad(
                r.id, f"record {r.id} was inserted: the chain starts after record {chain.anchor_id}"
            )
        if r.id > expected:
            gone = (
                f"record {expected} was"
                if r.id == expected + 1
                else f"records {expected} to {r.id - 1} were"
            )
            return bad(expected, f"{gone} removed")
        if r.erased_by is None and r.computed_hash() != r.hash:
            return bad(r.id, f"record {r.id} was altered: its hash does not match its content")
        if (
            r.erased_by is not None
        ):  # its names erased since: the deletion's record must list it as it is now
            if r.erased_by <= r.id:
                return bad(
                    r.id, f"record {r.id} was altered: it names no later deletion that erased it"
                )
            erased[r.id] = (r.computed_hash(), r.erased_by, r.user_id)
        if r.prev_hash != prev:
            return bad(
                r.id,
                f"record {r.id} does not follow record {r.id - 1}: one of them was altered, "
                f"or record {r.id} was inserted out of order",
            )
        if (logged := anchors.get(r.id)) is not None and logged != {r.hash}:
            return bad(r.id, _not_anchored(r.id, logged))
        if beside is None and (problem := _names_problem(r, unnamed)):
            beside = (r.id, problem)
        if r.action == "audit.prune":
            last_prune = r
        if r.action == "player.delete":
            listed = json.loads(r.changes).get("after", {}).get("records_erased", {})
            confirmed = set()
            for record_id, (now, by, user_id) in sorted(erased.items()):
                if by == r.id:
                    if listed.get(str(record_id)) != now or user_id != r.user_id:
                        return bad(
                            record_id,
                            f"record {record_id} was altered: it is not as the deletion that "
                            f"erased its names (record {r.id}) left it",
                        )
                    confirmed.add(str(record_id))
                    del erased[record_id]
            back = sorted(int(i) for i in set(listed) - confirmed if int(i) > chain.anchor_id)
            if back:
                return bad(
                    back[0],
                    f"record {back[0]} was altered: it holds again what the deletion of "
                    f"player {r.user_id} (record {r.id}) erased",
                )
            if r.user_id is not None:
                unnamed.pop(r.user_id, None)
        prev, expected, count = r.hash, r.id + 1, count + 1
    if expected <= chain.head_id:
        gone = (
            f"record {expected} was"
            if expected == chain.head_id
            else f"records {expected} to {chain.head_id} were"
        )
        return bad(expected, f"{gone} removed (from the end of the chain)")
    if prev != chain.head_hash:
        return bad(
            chain.head_id,
            f"record {chain.head_id} was altered or replaced: the chain's head holds another hash",
        )
    if chain.anchor_id:
        named = json.loads(last_prune.changes)["after"] if last_prune else {}
        if (named.get("anchor_id"), named.get("anchor_hash")) != (
            chain.anchor_id,
            chain.anchor_hash,
        ):
            return bad(
                chain.anchor_id + 1,
                f"the chain starts after record {chain.anchor_id}, "
                "but no prune record names that start",
            )
    # The chain holds; then what is kept beside it, the first record at fault named.
    problems = [
        (
            record_id,
            f"record {record_id} was altered: no deletion erased its names (record {by} is not "
            "one)",
        )
        for record_id, (_, by, _) in erased.items()
    ]
    problems += [
        (
            record_id,
            f"record {record_id}: the names kept beside it were removed, but player {user_id} "
            "was not deleted after it",
        )
        for user_id, record_id in unnamed.items()
    ]
    if beside is not None:
        problems.append(beside)
    if problems:
        return bad(*min(problems))
    if anchors:
        newest, first_cut = max(anchors), chain.head_id + 1
        if newest > chain.head_id:
            gone = (
                f"record {newest} was"
                if newest == first_cut
                else f"records {first_cut} to {newest} were"
            )
            return bad(
                first_cut,
                f"{gone} cut from the end of the chain: the log anchors record {newest}, "
                f"the chain ends at record {chain.head_id}",
            )
        if newest <= chain.anchor_id:
            return bad(
                newest,
                f"the log's newest head, record {newest}, is not in the chain: it starts after "
                f"record {chain.anchor_id} (a prune the log does not show, or a log older than the "
                "last prune: give the log up to now)",
            )
        if (logged := anchors.get(chain.anchor_id)) is not None and logged != {chain.anchor_hash}:
            return bad(
                chain.anchor_id,
                _not_anchored(chain.anchor_id, logged) + " (the record the chain starts after)",
            )
    return Verdict(count, chain.anchor_id + 1, chain.head_id, chain.head_hash)


def _not_anchored(record_id: int, logged: set[str]) -> str:
    if len(logged) > 1:
        return (
            f"the log anchors {len(logged)} different records {record_id}: the chain was cut and "
            "written again from there (a restored backup?), or the file holds the logs of two "
            "stores"
        )
    return (
        f"record {record_id} is not the record the log anchored (another hash): it was rewritten, "
        "or the chain was cut and written again from there"
    )


def _names_problem(r: Record, unnamed: dict[int, int]) -> str | None:
    """What is wrong with the values kept beside ``r`` (None: nothing). Sealed names with none kept
    are noted in ``unnamed`` (they must be the names of a player deleted later)."""
    changes = json.loads(r.changes)
    clear = json.loads(r.names) if r.names else None
    sealed = []
    for side, values in sorted(changes.items()):
        for name, value in sorted(values.items()) if isinstance(values, dict) else ():
            if name not in PERSONAL:
                continue
            if r.erased_by is not None and value != ERASED:
                return (
                    f"record {r.id} was altered: its names were erased, but its {name} "
                    f"({side}) is not"
                )
            if isinstance(value, dict) and isinstance(value.get("hmac"), str):
                sealed.append((side, name, value["hmac"]))
    if clear is not None and not sealed:
        return f"record {r.id}: names are kept beside it, but it seals none"
    if not sealed:
        return None
    if clear is None:
        if r.user_id is not None:
            unnamed.setdefault(r.user_id, r.id)
        return None
    if r.key is None:
        return f"record {r.id}: its names are kept, but player {r.user_id}'s key is gone"
    for side, name, digest in sealed:
        value = clear.get(side, {}).get(name)
        if not isinstance(value, str) or seal(r.key, name, value)["hmac"] != digest:
            return (
                f"record {r.id}: the {name} ({side}) kept beside it is not the one its hash "
                "covers (changed by hand?)"
            )
    return None


# -- the subcommands ------------------------------------------------------------------------


def _describe(c: dict) -> str:
    """``key: before -> after`` for each field that changed; ``key=value`` for a new one."""
    before, after = c.get("before", {}), c.get("after", {})
    parts = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if key not in before:
            parts.append(f"{key}={_value(key, new)}")
        elif old != new:
            parts.append(f"{key}: {_value(key, old)} -> {_value(key, new)}")
        elif old == ERASED:  # whether it changed is erased with it
            parts.append(f"{key}: {_value(key, old)}")
    return ", ".join(parts) or "no field changed"


def _value(key: str, value) -> str:
    if value == ERASED:  # a deleted player's name (docs/admin.md, "Erasure")
        return "<erased>"
    if isinstance(value, str):
        return shown(value)
    if key.endswith("_at") and type(value) is int:  # unix seconds (a key's expiry)
        return utc(value * 1000)
    return json.dumps(value)


def line(r: Record) -> str:
    target = (
        " ".join(
            t
            for t in (
                f"game {r.game_id}" if r.game_id is not None else "",
                f"player {r.user_id}" if r.user_id is not None else "",
            )
            if t
        )
        or "-"
    )
    request = f" [request {shown(r.request_id)}]" if r.request_id else ""
    return (
        f"{r.id:>6}  {utc(r.at_ms)}  {shown(r.actor)}{request}  {r.action}  {target}  "
        f"{_describe(r.shown_changes())}"
    )


def cmd_audit(args, settings):
    ctx = command_context()
    filters = {
        "since_ms": parse_time(args.since, round(ctx.clock() * 1000)) if args.since else None,
        "user_id": args.player,
        "game_id": args.game,
        "action": args.action_name,
        "actor": args.actor,
        "limit": args.limit,
    }
    with admin_store(settings) as store:
        records = store.audit_records(**filters)
    if args.json_lines:
        text = "\n".join(json.dumps(r.as_json()) for r in records)
    else:
        text = "\n".join(line(r) for r in records) if records else "no audit records match"
    return 0, {"records": [r.as_json() for r in records]}, text


def cmd_audit_verify(args, settings):
    anchors = read_heads(args.anchor) if args.anchor else None  # before the store is opened
    with admin_store(settings) as store:
        verdict = verify(store.audit_walk(), anchors)
    obj = dataclasses.asdict(verdict) | {"intact": verdict.problem is None}
    if anchors:
        newest = max(anchors)
        obj["anchor"] = {
            "heads": len(anchors),
            "newest_id": newest,
            "after_newest": max(0, verdict.head_id - newest),
        }
    if verdict.problem:
        return 1, obj, f"audit chain broken: {verdict.problem}"
    text = f"{verdict.records} records, chain intact from id {verdict.first_id}"
    if anchors:
        text += _anchored(anchors, verdict, obj["anchor"])
    return 0, obj, text


def _anchored(anchors: dict[int, set[str]], verdict: Verdict, summary: dict) -> str:
    """What an intact chain and the log's heads show: ``; it holds the 4 heads the log anchors
    (...)``."""
    pruned = sum(1 for record_id in anchors if record_id < verdict.first_id)
    held = len(anchors) - pruned
    notes = [f"{pruned} before it were pruned"] if pruned else []
    notes.append(f"the newest: record {summary['newest_id']}")
    if (later := summary["after_newest"]) > 0:
        notes[-1] += (
            f"; {later} record{'s' if later > 1 else ''} after it {'are' if later > 1 else 'is'} "
            "newer than the log"
        )
    return (
        f"; it holds the {held} head{'s' if held > 1 else ''} the log anchors"
        f"{' after its start' if pruned else ''} ({'; '.join(notes)})"
    )


def cmd_audit_prune(args, settings):
    ctx = command_context()
    now_ms = round(ctx.clock() * 1000)
    if args.before:
        before_ms = parse_time(args.before, now_ms)
    elif settings.audit_retention_days:
        before_ms = now_ms - settings.audit_retention_days * DAY_MS
    else:
        raise Invalid(
            "give --before TIME, or set AUTHSVC_AUDIT_RETENTION_DAYS (docs/configuration.md); "
            "nothing was pruned"
        )
    with admin_store(settings) as store:
        record = audit_ops.audit_prune(store, ctx, before_ms)
    after = json.loads(record.changes)["after"]
    obj = {
        "pruned": after["pruned"],
        "before": utc(before_ms),
        "anchor_id": after["anchor_id"],
        "record_id": record.id,
    }
    return (
        0,
        obj,
        (
            f"pruned {after['pruned']} audit records from before {utc(before_ms)}; the chain now "
            f"starts after record {after['anchor_id']} (this prune is record {record.id})"
        ),
    )


def add_parsers(top, common, parser_class) -> None:
    """``authsvc audit [filters]``, ``authsvc audit verify``, ``authsvc audit prune [--before
    TIME]``.

    ``audit`` lists with its own ``--json``: JSON lines, one record a line (an error
    is then one line on stderr only).
    """
    text = "list audit records, newest first (without ACTION); verify the chain; prune old records"
    p = top.add_parser("audit", help=text, description=text)
    p.set_defaults(func=cmd_audit, json=False)
    p.add_argument(
        "--since",
        metavar="TIME",
        help="records at or after TIME (2026-11-01, 2026-11-01T12:00Z, 30d, 12h)",
    )
    p.add_argument("--player", type=_positive, metavar="USER_ID", help="records about this player")
    p.add_argument("--game", type=_positive, metavar="GAME_ID", help="records about this game")
    p.add_argument(
        "--action",
        dest="action_name",
        metavar="ACTION",
        help="records of this action (player.revoke, ...)",
    )
    p.add_argument("--actor", metavar="ACTOR", help="records of this actor (cli:alice, ...)")
    p.add_argument(
        "--limit", type=_positive, default=100, metavar="N", help="at most N records (default 100)"
    )
    p.add_argument(
        "--json", dest="json_lines", action="store_true", help="one JSON object a line (JSON lines)"
    )
    sub = p.add_subparsers(
        dest="audit_command", required=False, metavar="ACTION", parser_class=parser_class
    )
    text = "check the hash chain; names the first record altered, removed or inserted (exit 1)"
    verify_parser = sub.add_parser("verify", parents=[common], help=text, description=text)
    verify_parser.set_defaults(func=cmd_audit_verify)
    verify_parser.add_argument(
        "--anchor",
        metavar="FILE",
        help="a log of the chain's heads (journalctl -u authsvc-admin -o cat; journalctl -t "
        "authsvc -o cat): the chain must hold each head logged since its start, so nothing was cut "
        "from its end",
    )
    text = (
        "delete the records older than TIME (default: AUTHSVC_AUDIT_RETENTION_DAYS); the chain "
        "stays verifiable"
    )
    prune = sub.add_parser("prune", parents=[common], help=text, description=text)
    prune.set_defaults(func=cmd_audit_prune)
    prune.add_argument(
        "--before",
        metavar="TIME",
        help="a date or date and time (UTC unless given), or 90d, 12h, 30m",
    )


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and text[0] != "0" and int(text) <= MAX_ID):
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 2^63-1, got {text!r}")
    return int(text)
