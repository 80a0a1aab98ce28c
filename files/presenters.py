"""The File object as the OpenAI API shows it; the batches app and the dashboard reuse it."""

from openrelay.api.lists import list_object


def _unix(moment):
    return None if moment is None else int(moment.timestamp())


def present_file(file):
    return {
        "id": file.public_id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": _unix(file.created_at),
        "expires_at": _unix(file.expires_at),
        "filename": file.filename,
        "purpose": file.purpose,
        # Deprecated by OpenAI but required by its schema: stored means processed.
        "status": "processed",
        "status_details": None,
    }


def present_file_list(files, has_more):
    return list_object([present_file(f) for f in files], has_more)


def present_deleted(public_id):
    return {"id": public_id, "object": "file", "deleted": True}
