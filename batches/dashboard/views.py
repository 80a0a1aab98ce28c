"""The browser dashboard's pages: thin views over batches.services and files.services.

Every query is scoped to the signed-in user's organization (its Membership, batches.dashboard.signin);
another organization's id answers 404, like an unknown one. Pages render the Batch object of
batches.presenters as batches.dashboard.display formats it; static/dashboard/dashboard.js keeps
them live from the websocket feeds of batches.dashboard.consumers, which send the same strings.

Raw input lines are never shown (a record's tool_config or workflow may carry
an `authorization` secret); only the rejections from create, which name the
line, its custom_id and the problem.
"""

import re
from functools import wraps

import orjson
from django.contrib import messages
from django.http import Http404, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import content_disposition_header, urlencode
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from batches import guardrails, progress, results, selectors, services, windows
from batches.dashboard import forms
from batches.dashboard.display import (
    TIMELINE,
    display,
    failures_context,
    file_row,
    operator_fragment,
    pace,
    quote_rows,
    retry_label,
    retryable,
    when,
    window_rows,
)
from batches.dashboard.signin import login, logout, member_required, staff_required
from batches.models import Batch, BatchStatus
from batches.presenters import PRESENTER_RELATED, batch_object
from batches.validation.params import ENDPOINTS, MAX_METADATA_PAIRS, PRIORITIES, parse_max_cost
from files import selectors as file_selectors
from files import services as file_services
from files.models import File, Purpose
from files.presenters import present_file
from files.responses import download_response, stream_response, stream_size
from files.uploads import receive_upload
from openrelay.api.errors import ApiError
from openrelay.api.throttles import BatchEstimateThrottle

__all__ = ["login", "logout"]  # the sign-in pages, routed beside these (batches.dashboard.urls)

PAGE_SIZE = 50
# The batch page lists this many rejected records; all of them download as JSONL.
REJECTIONS_SHOWN = 200


def _batch_query(request, batch_id):
    return (
        Batch.objects.for_org(request.organization)
        .select_related(*PRESENTER_RELATED, "input_file")
        .filter(public_id=batch_id)
    )


def _batch_or_404(request, batch_id):
    batch = _batch_query(request, batch_id).first()
    if batch is None:
        raise Http404("No such batch.")
    return batch


def _file_or_404(request, file_id):
    try:
        return file_selectors.get_file(request.organization, file_id)
    except ApiError:
        raise Http404("No such file.") from None


# ---------------------------------------------------------------------------
# Pages


def home(request):
    """`/`: the sign-in form for signed-out visitors, the batches page for members."""
    if not request.user.is_authenticated:
        return login(request)
    return batch_list(request)


@require_GET
@member_required
def batch_list(request):
    filters = _filters(request)
    try:
        found = selectors.page(
            request.organization,
            filters,
            after=request.GET.get("after") or None,
            before=request.GET.get("before") or None,
            size=PAGE_SIZE,
            related=PRESENTER_RELATED,
        )
    except Batch.DoesNotExist:
        raise Http404("No such batch.") from None
    rows = [
        display(batch_object(batch), progress.not_run(batch.status, batch.failed_count, batch.progress))
        for batch in found.batches
    ]
    query = {name: value for name, value in vars(filters).items() if value}
    return render(
        request,
        "dashboard/batches.html",
        {
            "rows": rows,
            "filters": filters,
            "older": urlencode({**query, "after": found.older}) if found.older else None,
            "newer": urlencode({**query, "before": found.newer}) if found.newer else None,
            # New batches appear live on the first page of the unfiltered list only.
            "insert_new": not found.newer and not request.GET.get("after") and not filters.active,
            "statuses": BatchStatus.values,
            "endpoints": ENDPOINTS,
            "models": selectors.models_used(request.organization),
            "nav": "batches",
        },
    )


def _filters(request):
    get = request.GET
    status = get.get("status", "")
    return selectors.BatchFilters(
        q=get.get("q", "").strip()[:200],
        status=status if status in BatchStatus.values else "",
        endpoint=get.get("endpoint", "") if get.get("endpoint") in ENDPOINTS else "",
        model=get.get("model", "")[:200],
    )


@require_GET
@member_required
def batch_detail(request, batch_id):
    # The tiles (the batch's counters) and the failures card (its records) as of one moment.
    batch, failures = selectors.failures_with(_batch_query(request, batch_id).first)
    if batch is None:
        raise Http404("No such batch.")
    obj = batch_object(batch)
    rejections = (obj["errors"] or {}).get("data") or []
    now = timezone.now()
    return render(
        request,
        "dashboard/batch.html",
        {
            "row": display(obj, failures.unrun),
            "pace": pace(obj, batch.progress, now.timestamp()),
            "batch": obj,
            "metadata": sorted((obj["metadata"] or {}).items()),
            # The page script's first snapshot and samples; the rejections are already on the page.
            "seed": {**obj, "errors": None},
            "samples": progress.series(obj["in_progress_at"], batch.progress),
            **failures_context(obj["id"], failures),
            "timeline": [(field, label, when(obj[field])) for field, label in TIMELINE],
            "expires": when(obj["expires_at"]),
            "paused_since": when((obj["openrelay"]["paused"] or {}).get("since")),
            "input_file": batch.input_file,
            "rejections": rejections[:REJECTIONS_SHOWN],
            "rejections_total": len(rejections),
            "accepted": obj["request_counts"]["total"],
            "just_created": request.GET.get("created") == "1",
            "retryable": retryable(obj),
            "retry_label": retry_label(failures.failed, failures.unrun),
            "server_now": int(now.timestamp()),
            "nav": "batches",
        },
    )


@require_GET
@member_required
def batch_rejections(request, batch_id):
    """Every rejected record of a batch as JSONL: line, code, param, message (no input content)."""
    batch = _batch_or_404(request, batch_id)
    body = b"".join(orjson.dumps(error) + b"\n" for error in batch.errors or [])
    response = HttpResponse(body, content_type="application/x-ndjson")
    response["Content-Disposition"] = content_disposition_header(True, f"{batch.public_id}_rejections.jsonl")
    return response


@require_GET
@member_required
def batch_results_so_far(request, batch_id):
    """The output (or, with ?kind=error, error) lines of the records finished so far, as JSONL."""
    batch = _batch_or_404(request, batch_id)
    kind = "error" if request.GET.get("kind") == "error" else "output"
    code = request.GET.get("code", "")[:64] or None
    stream, _ = results.render_one(batch, kind, code=code)
    name = f"{batch.public_id}_{kind}{f'_{code}' if code and kind == 'error' else ''}_so_far.jsonl"
    return stream_response(request, stream, stream_size(stream), re.sub(r"[^\w.-]", "_", name))


def batch_action(act):
    """A POST button on one batch: `act(request, batch)` does it and returns (the batch to show, what
    to say); an ApiError says why not, on the batch's own page."""

    @require_POST
    @member_required
    @wraps(act)
    def view(request, batch_id):
        batch = _batch_or_404(request, batch_id)
        try:
            shown, said = act(request, batch)
        except ApiError as exc:
            messages.error(request, exc.message)
            shown = batch
        else:
            messages.success(request, said)
        return redirect("dashboard:batch", batch_id=shown.public_id)

    return view


@batch_action
def batch_retry(request, batch):
    """A new batch of this finished batch's failed records; shows the new batch."""
    retry = services.retry_failed(batch)
    records = f"{retry.total_count} record{'s' if retry.total_count != 1 else ''}"
    return retry, f"Retrying {records} of {batch.public_id} as this new batch."


@batch_action
def batch_cancel(request, batch):
    services.cancel_batch(batch)
    return batch, f"Cancelling {batch.public_id}: records in flight stop, finished ones are kept."


@batch_action
def batch_pause(request, batch):
    guardrails.pause_batch(batch)
    return batch, f"Paused {batch.public_id}: calls in flight finish; its window clock runs on."


@batch_action
def batch_resume(request, batch):
    max_cost = parse_max_cost(request.POST.get("max_cost", "").strip() or None, "max_cost")
    guardrails.resume_batch(batch, max_cost_nanos=max_cost)
    return batch, f"Resumed {batch.public_id} where it stopped."


@csrf_exempt  # checked below, once the size-capped upload handler has parsed the body
@require_http_methods(["GET", "POST"])
@member_required
def new_batch(request):
    if request.method == "GET":
        return _new_batch_page(request, selected=request.GET.get("file"))
    try:
        upload = receive_upload(request)
    except ApiError as exc:
        return _new_batch_page(request, error=exc.message, status=exc.status)
    refused = CsrfViewMiddleware(lambda _: None).process_view(request, None, (), {})
    if refused is not None:
        upload.close()
        return refused
    if upload.fields.get("action") == "quote":
        return _quote_page(request, upload)
    try:
        batch = forms.create_batch(request.organization, upload)
    except ApiError as exc:
        return _new_batch_page(request, error=exc.message, status=exc.status, fields=upload.fields)
    return redirect(reverse("dashboard:batch", args=[batch.public_id]) + "?created=1")


def _quote_page(request, upload):
    """The form again with a quote of what Create would do, the quoted file chosen in it."""
    fields = upload.fields
    try:
        BatchEstimateThrottle().check(request.organization)  # the API's budget: one for both
    except ApiError as exc:
        upload.close()
        page = _new_batch_page(request, error=exc.message, status=exc.status, fields=fields)
        for header, value in exc.headers.items():  # Retry-After
            page[header] = value
        return page
    if upload.problem is not None:
        upload.close()
        return _new_batch_page(request, error=upload.problem.message, status=upload.problem.status, fields=fields)
    try:
        input_file_id, quote = forms.quote(request.organization, upload)
    except ApiError as exc:
        return _new_batch_page(request, error=exc.message, status=exc.status, fields=fields)
    return _new_batch_page(request, selected=input_file_id, fields=fields, quote=quote)


def _new_batch_page(request, *, selected=None, error=None, status=200, fields=None, quote=None):
    fields = fields or {}
    rows = [row for row in forms.metadata_rows(fields) if row[0] or row[1]]
    choices = File.objects.for_org(request.organization).live().filter(purpose=Purpose.BATCH).order_by("-created_at")
    return render(
        request,
        "dashboard/new_batch.html",
        {
            "endpoints": ENDPOINTS,
            "priorities": PRIORITIES,
            "files": [present_file(f) for f in choices[:PAGE_SIZE]],
            "selected": selected or fields.get("input_file_id"),
            "endpoint": fields.get("endpoint") or ENDPOINTS[0],
            "priority": fields.get("priority") or PRIORITIES[0],
            "window_rows": window_rows(quote, fields.get("completion_window") or windows.default().name),
            "max_cost": fields.get("max_cost") or "",
            # What was typed comes back after an error; at least METADATA_ROWS rows to fill.
            "metadata_rows": rows + [("", "")] * max(0, forms.METADATA_ROWS - len(rows)),
            "max_metadata": MAX_METADATA_PAIRS,
            "error": error,
            "quote": quote,
            "quote_rows": quote_rows(quote) if quote else None,
            "nav": "new",
        },
        status=status,
    )


@require_GET
@member_required
def file_list(request):
    try:
        files, has_more = file_selectors.list_files(
            request.organization, limit=PAGE_SIZE, after=request.GET.get("after") or None
        )
    except ApiError:
        raise Http404("No such file.") from None
    rows = [file_row(f) for f in files]
    return render(
        request,
        "dashboard/files.html",
        {
            "files": rows,
            "older": rows[-1]["id"] if has_more else None,
            "nav": "files",
        },
    )


@require_POST
@member_required
def file_delete(request, file_id):
    file = _file_or_404(request, file_id)
    try:
        file_services.delete_unpinned_file(file)
    except ApiError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Deleted {file.filename} ({file.public_id}).")
    return redirect("dashboard:files")


@require_GET
@member_required
def file_download(request, file_id):
    """The organization's own file, streamed (a 200 MB input is never read whole)."""
    return download_response(request, _file_or_404(request, file_id))


@require_GET
@staff_required
def operator_page(request):
    """Every model and deployment at work, the queues and the running batches by organization (live)."""
    return render(request, "dashboard/operator.html", {"operator": operator_fragment(), "nav": "operator"})
