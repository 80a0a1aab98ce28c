"""The Files routes: thin views over files.uploads, files.selectors and files.services."""

import hashlib

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from files import params, selectors, services
from files.models import File
from files.presenters import present_deleted, present_file, present_file_list
from files.responses import download_response
from files.uploads import receive_upload
from openrelay.api import openapi
from openrelay.api.errors import ApiError
from openrelay.api.negotiation import IgnoreAcceptNegotiation
from openrelay.core import idempotency

UPLOAD_HINT = (
    "Upload a file with a multipart POST to /v1/files, with the fields 'purpose' and 'file' "
    "(curl -F purpose=batch -F file=@requests.jsonl)."
)


class FilesView(APIView):
    method_hint = UPLOAD_HINT

    @extend_schema(
        operation_id="files_list",
        summary="List files",
        parameters=[openapi.PURPOSE, openapi.FILE_LIMIT, openapi.ORDER, openapi.AFTER],
        responses={200: openapi.ref("FileList"), **openapi.errors(400, 401, 404)},
    )
    def get(self, request):
        files, has_more = selectors.list_files(request.user.organization, **params.list_params(request.query_params))
        return Response(present_file_list(files, has_more))

    @extend_schema(
        operation_id="files_create",
        summary="Upload a batch input file",
        request={"multipart/form-data": openapi.ref("FileUpload")},
        parameters=[openapi.IDEMPOTENCY_KEY],
        responses={200: openapi.ref("File"), **openapi.errors(400, 401, 409, 413, 415, 503)},
    )
    def post(self, request):
        # request._request: the multipart body is parsed by Django with the
        # streaming, size-capped handler of files.uploads, not by DRF's parsers.
        upload = receive_upload(request._request)
        try:
            key = idempotency.key_of(request)
            purpose = params.upload_purpose(upload.fields)
            if upload.file is None and upload.problem is None:
                raise ApiError(
                    "Missing required parameter: 'file'. Send it as a multipart file part (curl: -F file=@batch.jsonl).",
                    param="file",
                    code="missing_required_parameter",
                )
            if upload.problem is not None:
                raise upload.problem
            expires_after_s = params.upload_expires_after(upload.fields)
        except ApiError:
            upload.close()
            raise
        organization = request.user.organization
        try:
            file = idempotency.once(
                organization,
                "files",
                key,
                _upload_print(upload.file, purpose, expires_after_s) if key is not None else None,
                lambda: services.create_uploaded_file(
                    organization=organization, upload=upload.file, purpose=purpose, expires_after_s=expires_after_s
                ),
                lambda public_id: File.objects.for_org(organization).live().filter(public_id=public_id).first(),
            )
        finally:
            upload.close()  # a repeat or a refusal stored nothing: its temporary file goes now
        return Response(present_file(file))


def _upload_print(file, purpose, expires_after_s):
    """The same upload: its bytes' sha256, purpose, filename and expiry (hashing 200 MB takes ~0.3 s)."""
    digest = hashlib.sha256()
    for chunk in file.chunks():
        digest.update(chunk)
    file.seek(0)
    return idempotency.fingerprint(digest.digest(), purpose.encode(), file.name.encode(), b"%r" % expires_after_s)


class FileView(APIView):
    method_hint = UPLOAD_HINT

    @extend_schema(
        operation_id="files_retrieve",
        summary="Retrieve a file",
        parameters=[openapi.FILE_ID],
        responses={200: openapi.ref("File"), **openapi.errors(401, 404)},
    )
    def get(self, request, file_id):
        return Response(present_file(selectors.get_file(request.user.organization, file_id)))

    @extend_schema(
        operation_id="files_delete",
        summary="Delete a file",
        parameters=[openapi.FILE_ID],
        responses={200: openapi.ref("FileDeleted"), **openapi.errors(401, 404, 409)},
    )
    def delete(self, request, file_id):
        file = selectors.get_file(request.user.organization, file_id)
        services.delete_unpinned_file(file)
        return Response(present_deleted(file.public_id))


class FileContentView(APIView):
    content_negotiation_class = IgnoreAcceptNegotiation

    @extend_schema(
        operation_id="files_content",
        summary="Download a file's bytes",
        parameters=[openapi.FILE_ID],
        responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY), **openapi.errors(401, 404)},
    )
    def get(self, request, file_id):
        file = selectors.get_file(request.user.organization, file_id)
        return download_response(request._request, file)
