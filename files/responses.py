"""The one way a stored file is sent to a client: streamed, never read whole."""

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header

from files import services

DOWNLOAD_CHUNK = 1024 * 1024


def download_response(request, file):
    """A streaming attachment response for `file` (a Django HttpRequest, not DRF's wrapper)."""
    stream = services.open_content(file)
    # Under ASGI a sync iterator would be read whole into memory first, so
    # each server gets the iterator it can stream.
    chunks = _async_chunks(stream) if isinstance(request, ASGIRequest) else _chunks(stream)
    response = StreamingHttpResponse(chunks, content_type="application/octet-stream")
    response["Content-Length"] = str(file.bytes)
    response["Content-Disposition"] = content_disposition_header(True, file.filename)
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
