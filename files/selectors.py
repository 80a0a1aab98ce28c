"""Reads of File rows, always scoped to one organization and to live (unexpired) files."""

from django.utils import timezone

from files.models import File
from openrelay.api.errors import NotFound
from openrelay.api.pagination import cursor_page, unknown_cursor

# OpenAI lists up to 10,000 files a page, and all of them when no limit is given.
LIST_LIMIT_MAX = 10_000


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
    # The cursor may have expired since the previous page; its position still counts.
    return cursor_page(
        files,
        limit=limit,
        after=after,
        order=order,
        cursors=File.objects.for_org(organization),
        no_cursor=unknown_cursor("file", after),
    )
