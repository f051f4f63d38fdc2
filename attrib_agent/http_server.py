"""How the agent serves HTTP (the API, the OTLP/HTTP receiver, the lab's span sink): one uvicorn set-up.

Keep-alive is `HTTP_KEEP_ALIVE_S`, not uvicorn's 5 s: OTel SDKs export every 5 s on one kept-alive
connection, and a connection closed at 5 s meets the next batch with a reset. No access log (a line per
request at hundreds a second), no lifespan (the agent starts and stops what the apps use itself), no proxy
headers middleware (nothing reads the client's address; it was a layer around every request).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from attrib_agent.config.types import HTTP_KEEP_ALIVE_S


def uvicorn_config(app: Any, host: str, port: int) -> uvicorn.Config:
    """The uvicorn configuration every HTTP server of the agent runs with."""
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", access_log=False,
                          proxy_headers=False, timeout_keep_alive=HTTP_KEEP_ALIVE_S)


async def start_server(app: Any, host: str, port: int, what: str,
                       name: str | None = None) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """Serve `app` on this loop; returns once listening: the server, its task, and its port (port 0 picks a
    free one). Raises OSError naming `what` when it cannot listen (the port is taken) or stopped at start-up."""
    sock = listening_socket(host, port, what)
    server = uvicorn.Server(uvicorn_config(app, host, port))
    task = asyncio.create_task(server.serve(sockets=[sock]), name=name)
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if task.done():
        await task
        raise OSError(f"{what} stopped at start-up on {host}:{port}")
    return server, task, int(sock.getsockname()[1])


def listening_socket(host: str, port: int, what: str) -> socket.socket:
    """The server's socket, bound here: a taken port raises OSError naming `what`, where uvicorn's own bind
    would log and `sys.exit(3)` from inside the event loop, past the agent's error path and its clean-up."""
    # proto TCP, as asyncio's own bind: asyncio sets TCP_NODELAY on accepted connections only when their proto says
    # TCP, and a socket made with proto 0 leaves Nagle on (answers then wait ~40 ms for the client's delayed ACK)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses a TIME_WAIT port
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"{what} cannot listen on {host}:{port}: {e.strerror}") from e
    return sock
