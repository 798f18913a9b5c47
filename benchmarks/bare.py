"""The reference: a bare WSGI app that answers every request with a fixed 60-byte JSON body.

It reads nothing of the request. It is what gunicorn (and nginx) cost on their
own; scripts/bench divides authsvc's figures by this one's, measured in the same run.
"""

BODY = b'{"success":true,"user_id":1001,"username":"player_00001001"}'
HEADERS = [("Content-Type", "application/json; charset=utf-8"), ("Content-Length", str(len(BODY)))]


def application(environ, start_response):
    start_response("200 OK", HEADERS)
    return [BODY]
