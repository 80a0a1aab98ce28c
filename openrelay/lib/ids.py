"""Public, prefixed ids: `file-`, `batch_`, `batch_req_`, `req_`.

Rows keep an integer primary key; the public id is what the API shows.
"""

import secrets
import string

_BASE62 = string.digits + string.ascii_letters


def _base62(length):
    return "".join(secrets.choice(_BASE62) for _ in range(length))


def new_file_id():
    return "file-" + _base62(22)


def new_batch_id():
    return "batch_" + secrets.token_hex(16)


def new_record_id():
    return "batch_req_" + secrets.token_hex(16)


def new_request_id():
    return "req_" + secrets.token_hex(16)
