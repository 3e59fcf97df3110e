"""A TCP proxy on loopback between the clients and a broker, that a test stalls and restores.

Stalled, it keeps every connection open but holds the bytes in both directions: requests already sent are
unanswered, as behind a network partition, until `restore()` lets everything through, late, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

from pin_identity.adapters.kafka.embedded import HOST


class TcpProxy:
    def __init__(self, listen_port: int, target_port: int):
        self.listen_port, self._target_port = listen_port, target_port
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._listen())

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    def cut(self) -> None:
        """Every connection dropped and new ones refused, until `restore()`."""
        self._call(self._cut())

    def stall(self) -> None:
        self._call(self._set_flowing(False))

    def restore(self) -> None:
        self._call(self._set_flowing(True))
        self._call(self._listen())

    def close(self) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _listen(self) -> None:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, HOST, self.listen_port, reuse_address=True
            )

    async def _cut(self) -> None:
        await self._close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.discard(writer)
        self._writers.clear()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            broker_reader, broker_writer = await asyncio.open_connection(HOST, self._target_port)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers |= {client_writer, broker_writer}
        await asyncio.gather(
            self._pipe(client_reader, broker_writer), self._pipe(broker_reader, client_writer)
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                await self._flowing.wait()  # stalled: the bytes wait here, in order
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
        self._writers.discard(writer)
