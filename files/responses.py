"""The one way a stored file is sent to a client: streamed, never read whole."""

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header

from files import services

DOWNLOAD_CHUNK = 1024 * 1024


def download_response(request, file):
    """A streaming attachment response for `file` (a Django HttpRequest, not DRF's wrapper)."""
    return stream_response(request, services.open_content(file), file.bytes, file.filename)


def stream_response(request, stream, size, filename):
    """A streaming attachment response for an open binary `stream` of `size` bytes; it is closed when sent."""
    # Under ASGI a sync iterator would be read whole into memory first, so
    # each server gets the iterator it can stream.
    chunks = _async_chunks(stream) if isinstance(request, ASGIRequest) else _chunks(stream)
    response = StreamingHttpResponse(chunks, content_type="application/octet-stream")
    response["Content-Length"] = str(size)
    response["Content-Disposition"] = content_disposition_header(True, filename)
    return response


def _chunks(stream):
    with stream:
        while chunk := stream.read(DOWNLOAD_CHUNK):
            yield chunk


async def _async_chunks(stream):
    read = sync_to_async(stream.read, thread_sensitive=False)
    try:
        while chunk := await read(DOWNLOAD_CHUNK):
            yield chunk
    finally:
        await sync_to_async(stream.close, thread_sensitive=False)()


def stream_size(stream):
    """The size of a seekable stream, left at its start."""
    size = stream.seek(0, 2)
    stream.seek(0)
    return size
