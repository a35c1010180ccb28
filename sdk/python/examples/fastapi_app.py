"""A FastAPI service through Sluice, run as under uvicorn: its lifespan opens what requests
share, a WebSocket endpoint echoes (each WebSocket consumes a session, which the SDK replaces
at once), and the runner drains on SIGTERM before the lifespan closes it all.

    pip install fastapi
    SLUICE_TOKEN=s3cret python3 -m sluice_sdk fastapi_app:app --app-dir examples \\
        --acceptor 127.0.0.1:7070 --service api --capacity 8
"""

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect


@asynccontextmanager
async def lifespan(app: FastAPI):
    app.state.visits = 0  # stands for a database pool, a model, a client session ...
    yield {"greeting": "hello"}  # request.state.greeting in every request


app = FastAPI(lifespan=lifespan)


@app.post("/")
@app.get("/")
async def index(request: Request) -> dict:
    request.app.state.visits += 1
    host = request.client.host if request.client else None
    return {"greeting": request.state.greeting, "visits": request.app.state.visits,
            "client": host}


@app.websocket("/echo")
async def echo(ws: WebSocket) -> None:
    await ws.accept()
    try:
        while True:
            await ws.send_text(await ws.receive_text())
    except WebSocketDisconnect:
        pass
