"""A list route's page: the `limit`, `order` and `after` query parameters over rows ordered by
(created_at, pk), in OpenAI's list envelope. The one pagination of the API: batches, webhook endpoints
and files (whose limits and default order OpenAI sets differently) all page through `cursor_page`."""

from django.db.models import Q

from openrelay.api.errors import ApiError, NotFound
from openrelay.api.lists import list_object
from openrelay.api.params import invalid_choice

LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 20, 100
ORDERS = ("asc", "desc")


def parse_limit(raw, *, default=LIST_LIMIT_DEFAULT, maximum=LIST_LIMIT_MAX):
    """A list route's `limit` query parameter: 1 to `maximum`, `default` when absent."""
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        limit = None
    if limit is None or not 1 <= limit <= maximum:
        raise ApiError(
            f"Invalid 'limit': expected an integer between 1 and {maximum}, but got {raw!r} instead.",
            param="limit",
            code="invalid_value",
        )
    return limit


def parse_order(raw, *, default="desc"):
    """A list route's `order` query parameter: asc (oldest first) or desc (newest first)."""
    order = default if raw is None else raw  # `?order=` is a value, not an absent parameter
    if order not in ORDERS:
        raise invalid_choice("order", order, ORDERS)
    return order


def unknown_cursor(noun, after):
    """An `after` that names no object of the caller's: a 404, as for the object itself. A 400 would say
    the request is malformed, which a well-formed id is not; the schema cannot state which ids exist."""
    return NotFound(f"No {noun} found with id '{after}' (the 'after' cursor).", param="after", code="not_found")


def cursor_page(queryset, *, limit, after=None, order="desc", cursors=None, no_cursor):
    """(rows, has_more): `queryset` in (created_at, pk) `order`, the rows strictly after the one whose
    public_id is `after`, at most `limit` of them. The cursor is looked up in `cursors` (default: the
    queryset itself; files pass every file of the organization, as an expired cursor still has its
    place); a missing one raises the ApiError `no_cursor` gives."""
    direction = "" if order == "asc" else "-"
    rows = queryset.order_by(f"{direction}created_at", f"{direction}pk")
    if after:
        cursor = (queryset if cursors is None else cursors).filter(public_id=after).values("created_at", "pk").first()
        if cursor is None:
            raise no_cursor
        created_at, pk = cursor["created_at"], cursor["pk"]
        if order == "asc":
            rows = rows.filter(Q(created_at__gt=created_at) | Q(created_at=created_at, pk__gt=pk))
        else:
            rows = rows.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=pk))
    page = list(rows[: limit + 1])
    return page[:limit], len(page) > limit


def newest_first_page(request, queryset, present, noun):
    """A list route's page: `queryset` newest first ((-created_at, -pk), rows with a public_id),
    cut by the `limit` and `after` query parameters, each row `present`ed, in the list envelope."""
    after = request.query_params.get("after")
    rows, has_more = cursor_page(
        queryset,
        limit=parse_limit(request.query_params.get("limit")),
        after=after,
        no_cursor=unknown_cursor(noun, after),
    )
    return list_object([present(row) for row in rows], has_more=has_more)
