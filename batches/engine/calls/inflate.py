"""gzip and deflate answers inflated as their pieces arrive (batches.engine.calls.transport), each
piece's output bounded: a compressed bomb never grows past the answer's cap, because what would come
out past it is never inflated."""

from __future__ import annotations

import zlib

# Inflated a step at a time, so no piece of output larger than this is ever made whole.
INFLATE_STEP = 1024 * 1024


class Inflater:
    """gzip or deflate, inflated as the pieces arrive, each piece's output bounded."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        # wbits 47: gzip or zlib by the header. "deflate" is decided on its first two bytes.
        self.stream = zlib.decompressobj(47) if encoding != "deflate" else None
        self.start = b""

    @property
    def ended(self) -> bool:
        return self.stream is not None and self.stream.eof

    def inflate_into(self, data: bytes, body: bytearray, most: int) -> None:
        """Inflate `data` onto `body` (a bytearray), INFLATE_STEP at a time, until `body` holds `most`
        bytes; what would come out past that is never inflated."""
        if self.stream is None:
            self.start += data
            if len(self.start) < 2:
                return
            data, self.start = self.start, b""
            self.stream = zlib.decompressobj(15 if zlib_header(data) else -15)
        while data and len(body) < most:
            body += self.stream.decompress(data, min(INFLATE_STEP, most - len(body)))
            data = self.stream.unconsumed_tail


def zlib_header(data: bytes) -> bool:
    """ "deflate" as the RFC means it (a zlib stream), or, as many servers send it, raw deflate."""
    return data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
