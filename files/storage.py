"""Where file bytes live (OPENRELAY_STORAGE_URL), and how the engines read records' lines from there.

OPENRELAY_STORAGE_URL picks Django's default storage:
- unset, or `file:///path`: a local folder (by default OPENRELAY_DATA_DIR/files);
- `s3://bucket/prefix?endpoint_url=...&region=...&addressing_style=path`:
  django-storages' S3 backend, on AWS or any S3-compatible store (MinIO,
  Ceph, R2, ...). Credentials come from the environment, by boto3's own chain
  (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, an instance role),
  never from the URL, so the URL can be shown.

A worker reads the lines of its claimed records in line order: `open_records`
reads object storage in ranges of RANGE_BYTES (one GET each), so a worker
holds one range of a batch's input, not the file (django-storages' own file
object downloads the whole object on the first read). Sequential readers
(create's validation, content downloads) use the backend's file, which
spools to a temporary file past SPOOL_BYTES instead of memory.

A store that is down or hangs must cost a request seconds, not minutes:
every S3 call has a connect and a read timeout and a bounded number of
attempts (OPENRELAY_STORAGE_CONNECT_TIMEOUT_S 5, _READ_TIMEOUT_S 30,
_ATTEMPTS 2; botocore's own defaults are 60 s, 60 s and 5 legacy attempts,
so a hung store held an upload past 90 s), and the API answers what they
raise with a 503 `storage_unavailable` (openrelay.api.handlers); /readyz
checks the bucket (openrelay.web.probes).
"""

import sys
from urllib.parse import parse_qs, urlsplit

RANGE_BYTES = 4 * 1024 * 1024
SPOOL_BYTES = 8 * 1024 * 1024
S3_BACKEND = "storages.backends.s3.S3Storage"
_S3_QUERY = {
    "endpoint_url": "endpoint_url",
    "region": "region_name",
    "addressing_style": "addressing_style",
    "signature_version": "signature_version",
}


def storage_from_url(url, default_location, *, connect_timeout_s=5.0, read_timeout_s=30.0, attempts=2):
    """STORAGES["default"] for an OPENRELAY_STORAGE_URL value (pure: settings call it)."""
    if not url:
        return {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": default_location}}
    parts = urlsplit(url)
    if parts.scheme == "file":
        return {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": parts.path}}
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(
            f"OPENRELAY_STORAGE_URL must be s3://bucket[/prefix][?endpoint_url=...] or file:///path, got {url!r}"
        )
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(query) - set(_S3_QUERY)
    if unknown:
        raise ValueError(f"OPENRELAY_STORAGE_URL: unknown parameter(s) {', '.join(sorted(unknown))}")
    options = {
        "bucket_name": parts.netloc,
        "location": parts.path.strip("/"),
        "file_overwrite": False,
        "max_memory_size": SPOOL_BYTES,
        "default_acl": None,
        "querystring_auth": True,
    }
    options.update({_S3_QUERY[key]: value for key, value in query.items()})
    options["client_config"] = _client_config(options, connect_timeout_s, read_timeout_s, attempts)
    return {"BACKEND": S3_BACKEND, "OPTIONS": options}


def _client_config(options, connect_timeout_s, read_timeout_s, attempts):
    # A client_config replaces the one django-storages would build from addressing_style and
    # signature_version, so they go in here too.
    from botocore.config import Config

    return Config(
        s3={"addressing_style": options.get("addressing_style")},
        signature_version=options.get("signature_version"),
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"total_max_attempts": attempts, "mode": "standard"},  # the first try included
    )


class RangedReader:
    """seek() and read() over an S3 object, a range of RANGE_BYTES (or the read, if longer) at a time."""

    def __init__(self, obj):
        self.obj = obj
        self.position = 0
        self.start, self.buffer = 0, b""

    def seek(self, offset):
        self.position = offset

    def read(self, length):
        end = self.position + length
        if not (self.start <= self.position and end <= self.start + len(self.buffer)):
            first = self.position
            last = first + max(length, RANGE_BYTES) - 1
            self.start = first
            self.buffer = self.obj.get(Range=f"bytes={first}-{last}")["Body"].read()
        data = self.buffer[self.position - self.start : end - self.start]
        self.position += len(data)
        return data

    def close(self):
        self.buffer = b""


def open_records(storage, name):
    """A seekable reader of `name` for reading records' lines (see the module's docstring)."""
    # An S3Storage exists only once its module is imported: local storage never pays for importing
    # boto3 here (issue 55: 0.11-0.14 s of CPU in each worker's first batch, for an isinstance check).
    s3 = sys.modules.get("storages.backends.s3")
    if s3 is not None and isinstance(storage, s3.S3Storage):
        from storages.utils import clean_name

        return RangedReader(storage.bucket.Object(storage._normalize_name(clean_name(name))))
    return storage.open(name, "rb")
