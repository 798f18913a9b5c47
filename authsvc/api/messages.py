"""The admin API's messages: a ``Request`` as a handler reads it and the ``Response`` it answers
with (JSON; authsvc/api/problems.py makes an error's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from authsvc.operations.context import Context


class Request:
    """What a handler may read: method, path parameters, query, JSON body, headers it needs, the
    context."""

    def __init__(
        self, environ: dict, params: dict, body: dict | None, ctx: Context, token_name: str
    ):
        self.environ = environ
        self.method = environ["REQUEST_METHOD"]
        self.params = params
        self.query = environ.get("QUERY_STRING", "")
        self.body = body
        self.ctx = ctx
        self.token_name = token_name

    def header(self, name: str) -> str | None:
        return self.environ.get("HTTP_" + name.upper().replace("-", "_"))


class Response:
    def __init__(
        self,
        status: int,
        obj: dict,
        headers: tuple[tuple[str, str], ...] = (),
        content_type: str = "application/json",
    ):
        self.status = status
        self.obj = obj
        self.headers = headers
        self.content_type = content_type
