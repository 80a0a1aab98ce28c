"""The New batch form: its fields as the API's create body, checked by the API's own parser.

The form posts a multipart upload (files.uploads.receive_upload): a dropped JSONL file or the
id of one uploaded before, the endpoint, priority, spend cap and metadata rows. Create and
Quote both read it here, so the quote describes exactly what Create then runs.
"""

from batches import services, windows
from batches.estimate import admission
from batches.estimate import quote as quotes
from batches.validation.params import parse_create_params
from files import services as file_services
from openrelay.api.errors import ApiError

# Empty metadata rows the form shows; its script adds more, up to MAX_METADATA_PAIRS.
METADATA_ROWS = 2


def create_batch(organization, upload):
    """Store the dropped file (or take a chosen one), then create the batch through the one create service."""
    if upload.problem is not None:
        upload.close()
        raise upload.problem
    input_file_id, stored = _input_file(organization, upload)
    try:
        params = parse_create_params(_form_body(upload.fields, input_file_id))
        admit = admission.judge(organization=organization, params=params)
        return services.create_batch(organization=organization, params=params, admit=admit)
    except ApiError:
        if stored is not None:  # uploaded for this batch only; nothing else refers to it
            file_services.delete_file(stored)
        raise


def quote(organization, upload):
    """(the input file's id, the quote object) of what Create would do. A dropped file is stored,
    so Create then runs what was quoted without uploading it twice."""
    input_file_id, _ = _input_file(organization, upload)
    params = parse_create_params(_form_body(upload.fields, input_file_id))
    return input_file_id, quotes.quote_object(quotes.estimate(organization=organization, **vars(params)))


def _input_file(organization, upload):
    """The id of the file to run, and the file stored from this upload (None when one was chosen)."""
    if upload.file is not None:
        stored = file_services.create_uploaded_file(organization=organization, upload=upload.file)
        return stored.public_id, stored
    if upload.fields.get("input_file_id"):
        return upload.fields["input_file_id"], None
    raise ApiError("Choose or drop a JSONL file, or pick one you uploaded before.", param="file")


def _form_body(fields, input_file_id):
    return {
        "input_file_id": input_file_id,
        "endpoint": fields.get("endpoint") or None,
        "completion_window": fields.get("completion_window") or windows.default().name,
        "priority": fields.get("priority") or None,
        "metadata": _form_metadata(fields),
        "openrelay": {"max_cost": (fields.get("max_cost") or "").strip() or None},
    }


def _form_metadata(fields):
    """The form's key/value rows as the API's `metadata` object (None when every row is empty);
    parse_create_params checks it as it checks the API's (batches.validation.params.parse_metadata)."""
    metadata = {}
    for key, value in metadata_rows(fields):
        if not key and not value:
            continue
        if not key:
            raise ApiError(f"Metadata value '{value[:64]}' has no key: give each value a key.", param="metadata")
        if key in metadata:
            raise ApiError(f"Metadata key '{key[:64]}' is given twice: give each key once.", param="metadata")
        metadata[key] = value
    return metadata or None


def metadata_rows(fields):
    keys = fields.getlist("metadata_key") if hasattr(fields, "getlist") else []
    values = fields.getlist("metadata_value") if hasattr(fields, "getlist") else []
    return [(key.strip(), value) for key, value in zip(keys, values, strict=False)]
