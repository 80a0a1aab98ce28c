"""A list route's page: the `limit` and `after` query parameters, newest first, in OpenAI's list envelope."""

from django.db.models import Q

from openrelay.api.errors import ApiError
from openrelay.api.lists import list_object

LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 20, 100


def parse_limit(raw):
    """A list route's `limit` query parameter: 1 to LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT when absent."""
    if raw is None or raw == "":
        return LIST_LIMIT_DEFAULT
    try:
        limit = int(raw)
    except ValueError:
        limit = None
    if limit is None or not 1 <= limit <= LIST_LIMIT_MAX:
        raise ApiError(f"Invalid 'limit': expected an integer between 1 and {LIST_LIMIT_MAX}, but got {raw!r} "
                       "instead.", param="limit", code="invalid_value")
    return limit


def newest_first_page(request, queryset, present, noun):
    """A list route's page: `queryset` newest first ((-created_at, -pk), rows with a public_id),
    cut by the `limit` and `after` query parameters, each row `present`ed, in the list envelope."""
    limit = parse_limit(request.query_params.get("limit"))
    rows = queryset.order_by("-created_at", "-pk")
    after = request.query_params.get("after")
    if after:
        cursor = queryset.filter(public_id=after).values("created_at", "pk").first()
        if cursor is None:
            raise ApiError(f"Invalid 'after': no {noun} found with id '{after}'.", param="after", code="invalid_value")
        # Rows strictly after the cursor in that order.
        rows = rows.filter(Q(created_at__lt=cursor["created_at"]) | Q(created_at=cursor["created_at"], pk__lt=cursor["pk"]))
    page = list(rows[: limit + 1])
    return list_object([present(row) for row in page[:limit]], has_more=len(page) > limit)
