"""A small stdlib HTTP/1.1 server whose clients cannot take the process's descriptors.

One request per connection (``Connection: close``). What one client may hold is bounded
(:class:`HttpLimits`): past the connection cap a connection is closed at once, unanswered,
and the refusals are logged at most once per interval; a request head has a total read
deadline (not per line, so a header sent every few seconds does not keep it open), a
header-count and a byte cap (431); an answer a client does not read within the write
timeout is dropped. A subclass answers a parsed :class:`RequestHead` in :meth:`handle`,
reading a body itself if it takes one (:meth:`read_body` bounds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any, Self

from ...views.page import content_security_policy

log = logging.getLogger("stovepipe_fsm.service")
LOOPBACK = "127.0.0.1"
READ_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class HttpLimits:
    """What one client may hold of the endpoint, so idle or slow clients cannot take the
    service's file descriptors: open connections (past the cap a connection is closed
    at once), the time to read a whole request head (not per line, so a header a few
    seconds apart does not keep it open), its header lines and bytes, the time to
    write an answer, and how often a refused connection is logged."""

    max_connections: int = 64
    read_deadline_s: float = READ_TIMEOUT_S
    max_headers: int = 64
    max_head_bytes: int = 16_384
    write_timeout_s: float = 5.0
    refusal_log_interval_s: float = 60.0


@dataclasses.dataclass(frozen=True)
class RequestHead:
    """A request line and its headers (names lower-cased; a repeated one keeps its first
    value), and the client's address."""

    method: str
    path: str
    headers: Mapping[str, str]
    client: str = ""


@dataclasses.dataclass(frozen=True)
class Answer:
    status: str
    body: str | bytes
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()


class HeadTooLarge(Exception):
    """A request head past :class:`HttpLimits` (lines or bytes)."""


class BodyRefused(Exception):
    """A body :meth:`BoundedHttpServer.read_body` will not read; ``answer`` says why."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


class BoundedHttpServer:
    """Serves until :meth:`close`; a subclass implements :meth:`handle`."""

    #: The methods named in the ``Allow`` header of a 405.
    allowed_methods = "GET, HEAD"
    #: What the log lines call this server.
    title = "http endpoint"

    def __init__(self, port: int, host: str = LOOPBACK, limits: HttpLimits | None = None) -> None:
        self.host = host
        self.port = port
        self.limits = limits or HttpLimits()
        self._server: asyncio.Server | None = None
        self.open_connections = 0
        #: Connections closed unanswered because the cap was reached (all time).
        self.refused = 0
        self._refused_unlogged = 0
        self._refusal_logged_at: float | None = None

    async def handle(self, head: RequestHead, reader: asyncio.StreamReader) -> Answer:
        raise NotImplementedError

    async def start(self) -> Self:
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, limit=self.limits.max_head_bytes
        )
        sockets: tuple[Any, ...] = tuple(self._server.sockets or ())
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("%s on %s:%d", self.title, self.host, self.port)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), READ_TIMEOUT_S)

    async def read_body(
        self, head: RequestHead, reader: asyncio.StreamReader, *, max_bytes: int, deadline_s: float
    ) -> bytes:
        """The request's body, by its ``Content-Length``; :class:`BodyRefused` with a 411
        without one (or with a chunked body), a 413 past ``max_bytes``, a 408 when it is
        not all there within ``deadline_s``."""
        text = head.headers.get("content-length", "")
        if "transfer-encoding" in head.headers or not text.isdigit():
            raise BodyRefused(Answer("411 Length Required", "send a Content-Length body\n"))
        size = int(text)
        if size > max_bytes:
            raise BodyRefused(
                Answer("413 Content Too Large", f"a body is at most {max_bytes} bytes\n")
            )
        try:
            return await asyncio.wait_for(reader.readexactly(size), deadline_s)
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            raise BodyRefused(Answer("408 Request Timeout", "the body did not arrive\n")) from None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serves a connection below the cap; past it, closes the connection unanswered
        and counts it, logging the refusals at most once per interval."""
        if self.open_connections >= self.limits.max_connections:
            self.refused += 1
            self._refused_unlogged += 1
            self._log_refusals()
            with contextlib.suppress(Exception):
                writer.transport.abort()
            return
        self.open_connections += 1
        try:
            await self._serve(reader, writer)
        finally:
            self.open_connections -= 1
            if not writer.transport.is_closing():  # a timed-out or failed answer
                writer.transport.abort()

    def _log_refusals(self) -> None:
        now = time.monotonic()
        last = self._refusal_logged_at
        if last is not None and now - last < self.limits.refusal_log_interval_s:
            return
        self._refusal_logged_at = now
        log.warning(
            "%s at its cap of %d connections: refused %d connection(s) since the last report",
            self.title,
            self.limits.max_connections,
            self._refused_unlogged,
        )
        self._refused_unlogged = 0

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[bytes, list[bytes]]:
        """The request line and the header lines that followed it, read to the blank
        line; raises :class:`HeadTooLarge` past the header count or byte cap (a line
        longer than the reader's limit raises ``ValueError``)."""
        request = await reader.readline()
        if not request.strip():
            return b"", []
        size, headers = len(request), []
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            headers.append(line)
            size += len(line)
            if len(headers) > self.limits.max_headers or size > self.limits.max_head_bytes:
                raise HeadTooLarge
        return request, headers

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request, lines = await asyncio.wait_for(
                self._read_head(reader), self.limits.read_deadline_s
            )
        except (HeadTooLarge, ValueError, asyncio.LimitOverrunError):
            status = "431 Request Header Fields Too Large"
            await self._answer(writer, Answer(status, "request head too large\n"))
            return
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            request = b""
        if not request.strip():
            # A connection that asks nothing (a browser opens spare ones ahead of need)
            # is closed unanswered: an answer would be read as the reply to the request
            # the browser sends on it later.
            with contextlib.suppress(Exception):
                writer.close()
            return
        method = ""
        try:
            parts = request.decode("latin-1").split()
            method = parts[0] if parts else ""
            head = RequestHead(
                method=method,
                path=parts[1] if len(parts) >= 2 else "",
                headers=_headers(lines),
                client=_peer(writer),
            )
            answer = await self.handle(head, reader)
        except BodyRefused as refused:
            answer = refused.answer
        except Exception:
            answer, method = Answer("400 Bad Request", "bad request\n"), ""
        await self._answer(writer, answer, head_only=method == "HEAD")

    async def _answer(
        self, writer: asyncio.StreamWriter, answer: Answer, head_only: bool = False
    ) -> None:
        """Writes one answer and closes; a client that does not read it within the write
        timeout is dropped."""
        body = answer.body
        payload = body.encode() if isinstance(body, str) else body
        extra = list(answer.headers)
        if answer.status.startswith("405"):
            extra.append(("Allow", self.allowed_methods))
        head = (
            f"HTTP/1.1 {answer.status}\r\nContent-Type: {answer.content_type}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n"
            f"Content-Security-Policy: {content_security_policy()}\r\n"
            "X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in extra)
            + "\r\n"
        )
        with contextlib.suppress(Exception):
            writer.write(head.encode() + (b"" if head_only else payload))
            await asyncio.wait_for(writer.drain(), self.limits.write_timeout_s)
            writer.close()


def _headers(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon:
            raise ValueError("a header line without a colon")
        headers.setdefault(name.strip().lower(), value.strip())
    return headers


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""
