"""Receiving a batch input upload: streamed, size-capped, checked on the way in.

The request body is parsed by Django's multipart parser with one upload
handler, BatchInputUploadHandler, which writes the `file` part to a temporary
file in FILE_UPLOAD_TEMP_DIR chunk by chunk, counts its bytes and stops
storing as soon as the limit is passed. While the bytes go by it checks the
file as a whole (UTF-8 text, no NUL byte, not empty); every line, the first
included, is checked by batch create, where a bad one rejects only its record.
"""

import codecs
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.files.uploadedfile import TemporaryUploadedFile
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import UnreadablePostError
from django.http.multipartparser import MultiPartParserError

from openrelay.api.errors import ApiError
from openrelay.web.asgi_handler import MULTIPART_OVERHEAD_BYTES

CHUNK_SIZE = 1024 * 1024
_BLANK = b" \t\r\n"
_FORMAT_HINT = "Batch input must be JSONL: UTF-8 text with one JSON request object per line."


class PayloadTooLarge(ApiError):
    status = 413

    def __init__(self, limit):
        super().__init__(
            f"File is too large. The limit for a batch input file is {_size(limit)}. "
            "If a large upload returns 413, image compression is "
            "almost always the fix: compress images (for example as JPEG, about 1,600 px on the "
            "long side) before base64-encoding them, or split the requests across several batches.",
            param="file",
            code="file_too_large",
        )


def _size(limit):
    megabytes = limit / 1024 / 1024
    return f"{limit:,} bytes ({megabytes:g} MB)" if megabytes >= 1 else f"{limit:,} bytes"


@dataclass
class ReceivedUpload:
    """The parsed form: text fields, the stored temp file (or None) and the first problem found."""

    fields: dict
    file: TemporaryUploadedFile | None
    problem: ApiError | None

    def close(self):
        if self.file is not None:
            self.file.close()  # deletes the temporary file unless storage moved it


def receive_upload(request):
    """Parse a multipart upload from a Django HttpRequest, streaming the file part to disk.

    Raises PayloadTooLarge when the file (or the declared body) is over
    OPENRELAY_MAX_UPLOAD_BYTES; nothing of it is kept then.
    """
    limit = settings.OPENRELAY_MAX_UPLOAD_BYTES
    if _require_multipart(request) > limit + MULTIPART_OVERHEAD_BYTES:
        # The ASGI handler read the body to its end and dropped what passed the cap.
        raise PayloadTooLarge(limit)
    handler = BatchInputUploadHandler(request, limit=limit)
    request.upload_handlers = [handler]
    try:
        fields, files = _parse(request)
    except ApiError:
        handler.discard()
        raise
    if handler.too_large:
        raise PayloadTooLarge(limit)
    return ReceivedUpload(fields=fields, file=files.get("file"), problem=handler.problem)


def _require_multipart(request):
    """The body length of a multipart request (however it was framed); 415 for any other type."""
    content_type = request.META.get("CONTENT_TYPE", "")
    if not content_type.startswith("multipart/form-data"):
        raise ApiError(
            f"Unsupported Content-Type {content_type.split(';')[0] or '(none)'!r}: upload the file as "
            "multipart/form-data with the fields 'file' and 'purpose'.",
            status=415,
            code="unsupported_media_type",
        )
    # Under ASGI this is the count of bytes that arrived (openrelay.web.asgi_handler), chunked or not.
    return _declared_length(request)


def _parse(request):
    try:
        return request.POST, request.FILES
    except RequestDataTooBig:
        raise ApiError(
            "The form fields are too large. Send the file as a file part: -F file=@batch.jsonl.",
            status=413,
            code="request_too_large",
        ) from None
    except (MultiPartParserError, SuspiciousOperation) as exc:  # bad boundary, too many fields or files
        raise ApiError(f"Malformed multipart/form-data request: {exc}", code="invalid_multipart") from None
    except UnreadablePostError:
        raise ApiError("The upload was interrupted before the whole body arrived.", code="upload_interrupted") from None


def _declared_length(request):
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class BatchInputUploadHandler(FileUploadHandler):
    """Stores the first `file` part in a temporary file; counts, checks and caps it while it streams."""

    chunk_size = CHUNK_SIZE

    def __init__(self, request=None, *, limit):
        super().__init__(request)
        self.limit = limit
        self.too_large = False
        self.problem = None
        # Not named `file`: Django's parser closes `handler.file` on StopUpload
        # and would trip over None; this handler cleans up after itself.
        self.upload = None
        self._taking = False
        self._size = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._has_text = False  # a byte other than blank space seen

    def new_file(self, field_name, file_name, content_type, content_length, charset=None, content_type_extra=None):
        super().new_file(field_name, file_name, content_type, content_length, charset, content_type_extra)
        # Only the first `file` part is taken; any other file part is read past.
        self._taking = field_name == "file" and self.upload is None and self.problem is None
        if self._taking:
            self.upload = TemporaryUploadedFile(file_name, content_type, 0, charset, content_type_extra)

    def receive_data_chunk(self, raw_data, start):
        if not self._taking:
            return None
        self._size += len(raw_data)
        if self._size > self.limit:
            self.too_large = True
            self.discard()
            # connection_reset=False: the parser reads past the rest of the
            # body (in chunks, storing nothing) so the client gets the 413.
            raise StopUpload(connection_reset=False)
        self._check(raw_data, start)
        if self.problem is not None:
            self.discard()
            return None
        self.upload.write(raw_data)
        return None

    def file_complete(self, file_size):
        if not self._taking:
            return None
        self._taking = False
        self._finish_checks()
        if self.problem is not None:
            self.discard()
            return None
        self.upload.seek(0)
        self.upload.size = file_size
        return self.upload

    def upload_interrupted(self):
        if self._taking:  # the body ended inside our file part
            self.discard()
            self.problem = ApiError(
                "The upload ended inside the file part (no closing multipart boundary): the file is incomplete.",
                param="file",
                code="upload_interrupted",
            )

    def discard(self):
        """Drop whatever was stored of the upload (the temporary file deletes itself on close)."""
        self._taking = False
        if self.upload is not None:
            self.upload.close()

    # Whole-file checks, cheap enough to run on every chunk.

    def _check(self, chunk, start):
        if (nul := chunk.find(b"\x00")) != -1:
            self._fail(f"the file is binary, not text (a NUL byte at byte {start + nul:,}).")
            return
        pending = len(self._decoder.getstate()[0])
        # Pure-ASCII chunks (the common case) skip the decoder; it only has to
        # see them when it holds the start of a multi-byte character.
        if pending or not chunk.isascii():
            try:
                self._decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                self._fail(
                    f"the file is not UTF-8 text (an invalid byte sequence at byte {start - pending + exc.start:,})."
                )
                return
        if not self._has_text:
            self._has_text = bool(chunk.strip(_BLANK))

    def _finish_checks(self):
        if self.problem is not None:
            return
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            self._fail("the file is not UTF-8 text (it ends inside a multi-byte character).")
            return
        if not self._has_text:
            self.problem = ApiError(
                f"The file is empty: it holds no requests. {_FORMAT_HINT}", param="file", code="empty_file"
            )

    def _fail(self, reason):
        self.problem = ApiError(
            f"Invalid file format for Batch API: {reason} {_FORMAT_HINT}", param="file", code="invalid_file_format"
        )
