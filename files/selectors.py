"""Reads of File rows, always scoped to one organization and to live (unexpired) files."""

from django.db.models import Q
from django.utils import timezone

from files.models import File
from openrelay.api.errors import ApiError, NotFound

LIST_LIMIT_MAX = 10_000
ORDERS = ("asc", "desc")


def get_file(organization, public_id, now=None):
    """The organization's live file, or 404: another organization's id and an expired file look the same."""
    file = File.objects.for_org(organization).live(now).filter(public_id=public_id).first()
    if file is None:
        raise NotFound(f"No such File object: {public_id}", param="id", code="file_not_found")
    return file


def list_files(organization, *, purpose=None, limit=LIST_LIMIT_MAX, order="desc", after=None, now=None):
    """One page of the organization's live files, newest first by default. Returns (files, has_more)."""
    now = now or timezone.now()
    files = File.objects.for_org(organization).live(now)
    if purpose:
        files = files.filter(purpose=purpose)
    if after:
        files = files.filter(_after(organization, after, order))
    if order == "asc":
        files = files.order_by("created_at", "pk")
    else:
        files = files.order_by("-created_at", "-pk")
    page = list(files[: limit + 1])
    return page[:limit], len(page) > limit


def _after(organization, after, order):
    # The cursor may have expired since the previous page; its position still counts.
    cursor = File.objects.for_org(organization).filter(public_id=after).values("created_at", "pk").first()
    if cursor is None:
        raise ApiError(f"No such File object: {after}", param="after", code="invalid_value")
    created_at, pk = cursor["created_at"], cursor["pk"]
    if order == "asc":
        return Q(created_at__gt=created_at) | Q(created_at=created_at, pk__gt=pk)
    return Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=pk)
