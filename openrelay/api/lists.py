"""OpenAI's list envelope, used by every paginated answer (and the CLI's merged pages).

Plain Python, no Django: the `orl` CLI imports it too.
"""


def list_object(data, has_more):
    """`{"object": "list", "data", "first_id", "last_id", "has_more"}` over already-presented items."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
