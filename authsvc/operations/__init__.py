"""The operations layer: one function per admin write (and the reads beside them), for every front
door.

The admin command (authsvc/cli/command.py) parses arguments, calls one of these and prints
the result; the admin API will do the same over HTTP (docs/admin.md). Each
function validates its input once (authsvc/names.py's rules, the TTL cap here),
takes a ``Context`` (who acts, which request, a clock) and raises only typed
errors of authsvc/errors.py, worded for neither front door (NotFound, Conflict,
PreconditionFailed, Invalid naming its ``field``), and the store's StoreLocked /
StoreUnavailable / ConfigError; each front door maps them once. Every write is one transaction of
the store (``store.write``, authsvc/store/writes.py), its audit record inside it: what a
write reads to decide (If-Match, a mint's epoch) is what it acts on. Secrets made here
(a new api key, a token) are returned to the caller to show once, never recorded.

Minting a token changes nothing, but hands out a credential: it is recorded too,
as ``token.mint`` with the game, the player and the epoch (never the token), so
"who could log in as this player" has an answer (docs/admin.md, "The audit trail").
"""
