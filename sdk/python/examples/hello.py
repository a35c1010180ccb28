"""Answers "hello" through Sluice: the whole service is the application below. The SDK's
runner dials the acceptor, keeps --capacity sessions registered, and on SIGTERM/SIGINT drains
and waits for the proxy to close every session:

    SLUICE_TOKEN=s3cret python3 -m sluice_sdk hello:app --app-dir examples \\
        --acceptor 127.0.0.1:7070 --service hello --capacity 4
"""


async def app(scope, receive, send):
    """``hello\\n`` to every request (and nothing to do at the lifespan's startup)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello\n"})
