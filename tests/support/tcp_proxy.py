"""A TCP proxy on loopback between clients and a server (a broker's port, or PostgreSQL's Unix socket), that a
test stalls, black-holes and restores.

Stalled, a connection stays open but its bytes are held in both directions: requests already sent go
unanswered, as behind a network partition, until `restore()` lets them through, late and in order. Bytes
held for a client that closes its connection meanwhile are dropped, as a partitioned TCP connection's are.

Black-holed, closes are held too: a side that closes its connection meanwhile (a server ending a session)
closes it to the other side only once the path is back, after the bytes it sent before. Neither end learns
anything from the proxy: only its own timeouts can tell it that the path went silent. (The proxy's own sockets
still acknowledge every byte: TCP keepalives and retransmission timeouts see nothing wrong, as behind a stuck
middlebox; a path that drops packets fails those sooner, never later.)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from pin_identity.adapters.kafka.embedded_kafka import HOST


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, held: bool, closes_held: bool):
        self.held = held
        self.closes_held = closes_held
        self.released = asyncio.Event()
        if not held:
            self.released.set()
        self.writers: list[asyncio.StreamWriter] = []
        self.held_bytes = 0

    def release(self) -> None:
        self.held = False
        self.released.set()

    def hold(self, closes_too: bool) -> None:
        self.held = True
        self.closes_held = closes_too
        self.released.clear()

    def abort(self) -> None:
        for writer in self.writers:
            writer.transport.abort()


class TcpProxy:
    def __init__(self, listen_port: int, target: int | str, *, accepted: Callable[[int], None] | None = None):
        """`target`: the server's port on loopback, or the path of its Unix socket. `accepted` is told each
        connection's client port (on a thread of its own: it may look the port's process up)."""
        self.listen_port, self._target = listen_port, target
        self._accepted = accepted
        self._loop = asyncio.new_event_loop()
        self._links: set[_Link] = set()
        self._stall_new = False
        self._closes_held = False
        self._server: asyncio.Server | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._listen())

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        if self._closed:  # a timer's restore after the test closed the proxy: its loop is gone
            coroutine.close()
            return
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    def stall(self, *, new_connections_too: bool = True) -> None:
        """Hold the bytes of every open connection (and of new ones, unless told otherwise)."""
        self._call(self._stall(new_connections_too, closes_too=False))

    def black_hole(self) -> None:
        """Hold the bytes and the closes of every connection, open or new, until `restore()`."""
        self._call(self._stall(True, closes_too=True))

    def restore(self) -> None:
        self._call(self._restore())

    def move_to(self, target: int | str) -> None:
        """The endpoint now leads to another server (a moved virtual address, a proxy's new backend): open
        connections are cut, as a moved address's are, and new ones reach `target`."""
        self._call(self._move_to(target))

    def held_bytes(self) -> int:
        """Bytes the stalled connections hold (a signal that a client sent something into the stall)."""
        return sum(link.held_bytes for link in list(self._links))

    def close(self) -> None:
        self._call(self._close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _stall(self, new_connections_too: bool, *, closes_too: bool) -> None:
        self._stall_new, self._closes_held = new_connections_too, closes_too
        for link in self._links:
            link.hold(closes_too)

    async def _restore(self) -> None:
        self._stall_new = self._closes_held = False
        for link in self._links:
            link.release()

    async def _move_to(self, target: int | str) -> None:
        self._target = target
        for link in self._links:
            link.abort()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, self.listen_port, reuse_address=True)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in self._links:
            link.closes_held = False
            link.release()
            link.abort()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if isinstance(self._target, str):
            return await asyncio.open_unix_connection(self._target)
        return await asyncio.open_connection(HOST, self._target)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await self._connect()
        except OSError:
            client_writer.transport.abort()
            return
        if self._accepted is not None:
            client_port = client_writer.get_extra_info("peername")[1]
            self._loop.run_in_executor(None, self._accepted, client_port)
        link = _Link(held=self._stall_new, closes_held=self._closes_held)
        link.writers = [client_writer, server_writer]
        self._links.add(link)
        await asyncio.gather(
            self._pipe(link, client_reader, server_writer), self._pipe(link, server_reader, client_writer)
        )
        self._links.discard(link)

    async def _pipe(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held: list[bytes] = []
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await self._carry(link, reader, writer, held)
        if link.held and link.closes_held:
            # Black-holed: the close reaches the other side once the path is back, after what was sent first.
            await link.released.wait()
            with contextlib.suppress(OSError):
                await self._flush(link, held, writer)
        link.abort()  # a closed side closes the other; what was held for it never arrives

    async def _carry(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, held: list[bytes]
    ) -> None:
        """Copy what `reader` receives to `writer` (holding it while the link is held) until it closes."""
        while True:
            read = asyncio.ensure_future(reader.read(65536))
            while link.held and not read.done():
                # Reading goes on while held, so that a close is seen (and the held bytes dropped).
                released = asyncio.ensure_future(link.released.wait())
                await asyncio.wait({read, released}, return_when=asyncio.FIRST_COMPLETED)
                released.cancel()
            if not link.held and held:
                await self._flush(link, held, writer)
            data = await read
            if not data:
                return
            if link.held:
                held.append(data)
                link.held_bytes += len(data)
                continue
            writer.write(data)
            await writer.drain()

    @staticmethod
    async def _flush(link: _Link, held: list[bytes], writer: asyncio.StreamWriter) -> None:
        for chunk in held:
            writer.write(chunk)
        held.clear()
        link.held_bytes = 0
        await writer.drain()
