"""A WSGI app that answers with what reached it: the names of its environ's request headers
(``HTTP_*``, ``CONTENT_TYPE``, ``CONTENT_LENGTH``) and the body's length, as JSON. Served by the
shipped gunicorn.conf.py behind the shipped nginx site in tests/integration/test_deploy.py, to see
which headers nginx passes on."""

import json


def application(environ, start_response):
    headers = sorted(k for k, v in environ.items() if k.startswith(("HTTP_", "CONTENT_")) and v)
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    answer = json.dumps(
        {
            "headers": headers,
            "body": body.decode("latin-1"),
            "content_type": environ.get("CONTENT_TYPE", ""),
        }
    ).encode()
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))]
    )
    return [answer]
