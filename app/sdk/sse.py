"""A Server-Sent Events parser (the WHATWG event-stream format) over a byte stream.

Lines end in LF, CR or CRLF; ``:`` starts a comment; ``data`` lines join with LF; an event is
dispatched at a blank line when it has data; ``id`` persists across events (the last event id
a reconnect sends); ``retry`` sets the reconnection delay.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str  # "message" when the stream named none
    data: str
    last_event_id: str  # the stream's last event id when this event was dispatched


class SseParser:
    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""
        self.last_event_id = ""
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._buffer += chunk
        out: list[SseEvent] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return out
            end, skip = cut
            line = self._buffer[:end].decode("utf-8", "replace")
            self._buffer = self._buffer[end + skip :]
            event = self._line(line)
            if event is not None:
                out.append(event)

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            if not self._data:
                self._event = ""
                return None
            event = SseEvent(self._event or "message", "\n".join(self._data), self.last_event_id)
            self._data, self._event = [], ""
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """(index of the line end, its length) of the first complete line, or None."""
    lf, cr = buffer.find(b"\n"), buffer.find(b"\r")
    if cr == -1 and lf == -1:
        return None
    if cr == -1 or (lf != -1 and lf < cr):
        return lf, 1
    if cr + 1 == len(buffer):
        return None  # a CR at the end: maybe the first half of CRLF, wait for the next byte
    return cr, 2 if buffer[cr + 1 : cr + 2] == b"\n" else 1


async def sse_events(
    chunks: AsyncIterable[bytes], parser: SseParser | None = None
) -> AsyncIterator[SseEvent]:
    parser = parser or SseParser()
    async for chunk in chunks:
        for event in parser.feed(chunk):
            yield event
