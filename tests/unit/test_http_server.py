"""The agent's HTTP servers bind their socket themselves (`http_server.listening_socket`): a taken port is the
agent's own error, and an accepted connection still gets TCP_NODELAY, as with uvicorn's own bind.

Without TCP_NODELAY a small answer on a kept-alive connection waits for the client's delayed ACK (~40 ms):
`benchmarks.api_load` read p50 44 ms where it reads 0.9 ms, from a socket made with proto 0, on which asyncio
does not set the option."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from attrib_agent.http_server import start_server


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.timeout(30)
def test_an_accepted_connection_has_tcp_nodelay() -> None:
    async def main() -> int:
        server, task, port = await start_server(_ok, "127.0.0.1", 0, "test server")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        (conn,) = server.server_state.connections  # the server's side of this connection
        nodelay = conn.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.close()
        server.should_exit = True
        await task
        return int(nodelay)

    assert asyncio.run(main()) != 0


@pytest.mark.timeout(30)
def test_a_taken_port_raises_oserror_naming_the_server() -> None:
    async def main() -> None:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            with pytest.raises(OSError, match=f"test server cannot listen on 127.0.0.1:{port}"):
                await start_server(_ok, "127.0.0.1", port, "test server")

    asyncio.run(main())
