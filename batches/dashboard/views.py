"""The browser dashboard: thin views over batches.services and files.services.

Every query is scoped to the signed-in user's organization (its Membership);
another organization's id answers 404, like an unknown one. Pages render the
Batch object of batches.presenters; static/dashboard/dashboard.js keeps them live
from the websocket feeds of batches.dashboard.consumers, formatting values the way
`display` does here.

Raw input lines are never shown (a record's tool_config or workflow may carry
an `authorization` secret); only the rejections from create, which name the
line, its custom_id and the problem.
"""

import re
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import wraps

import orjson
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.http import content_disposition_header, urlencode
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from batches import guardrails, operator, progress, results, selectors, services
from batches.estimate import quote as quotes
from batches.lifecycle import PAUSABLE
from batches.models import TERMINAL_BATCH_STATUSES, Batch, BatchStatus
from batches.presenters import PRESENTER_RELATED, batch_object
from batches.validation.params import ENDPOINTS, MAX_METADATA_PAIRS, PRIORITIES, parse_create_params, parse_max_cost
from files import selectors as file_selectors
from files import services as file_services
from files.models import File, Purpose
from files.presenters import present_file
from files.responses import download_response, stream_response, stream_size
from files.uploads import receive_upload
from openrelay.api.errors import ApiError
from openrelay.api.throttles import BatchEstimateThrottle
from openrelay.core.models import Membership

PAGE_SIZE = 50
# The batch page lists this many rejected records; all of them download as JSONL.
REJECTIONS_SHOWN = 200
TIMELINE = (
    ("created_at", "Created"),
    ("in_progress_at", "In progress"),
    ("cancelling_at", "Cancelling"),
    ("finalizing_at", "Finalizing"),
    ("completed_at", "Completed"),
    ("failed_at", "Failed"),
    ("expired_at", "Expired"),
    ("cancelled_at", "Cancelled"),
)
# Empty metadata rows the new-batch form shows; its script adds more, up to MAX_METADATA_PAIRS.
METADATA_ROWS = 2
CANCELLABLE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
RETRYABLE = (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)


# ---------------------------------------------------------------------------
# Access


class MemberAuthenticationForm(AuthenticationForm):
    """Django's sign-in form; a user who belongs to no organization has nothing to see here."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        if not Membership.objects.filter(user=user).exists():
            raise ValidationError(
                "This account belongs to no organization. Ask an operator to add it to one "
                "(manage.py add_user, or the user's page in the admin).",
                code="no_organization",
            )


login = auth_views.LoginView.as_view(
    template_name="dashboard/login.html",
    authentication_form=MemberAuthenticationForm,
    next_page="/",
    redirect_authenticated_user=True,
)
logout = auth_views.LogoutView.as_view(next_page="/")


def member_required(view):
    """Signed in and in an organization; sets request.organization."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        membership = Membership.objects.select_related("organization").filter(user=request.user).first()
        if membership is None:
            raise PermissionDenied("This account belongs to no organization.")
        request.organization = membership.organization
        return view(request, *args, **kwargs)

    return wrapped


def staff_required(view):
    """Signed in as an operator (is_staff); sets request.organization when the operator has one."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("The operator page is for operators (staff users) only.")
        membership = Membership.objects.select_related("organization").filter(user=request.user).first()
        request.organization = membership.organization if membership else None
        return view(request, *args, **kwargs)

    return wrapped


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
# Display: the same rules as static/dashboard/dashboard.js


def display(batch, not_run=0):
    """What a page shows of a Batch object (a dict from batch_object); `not_run`: of its failed
    records, those a cancel or an expiry closed before they ran (progress.not_run)."""
    counts = batch["request_counts"]
    failed = counts["failed"] - not_run
    done, total = counts["completed"] + failed, counts["total"]
    usage = batch["usage"] or {}
    cost = batch["openrelay"].get("cost") or {}
    return {
        "batch": batch,
        "percent": percent(done, total, batch["status"]),
        "counts": f"{done:,} / {total:,}",
        "completed": f"{counts['completed']:,}",
        "failed": f"{failed:,}",
        "not_run": f"{not_run:,}",
        "has_not_run": not_run > 0,
        # The bar's parts, in % of the total: succeeded, failed, not run.
        "bar": [share(counts["completed"], total), share(failed, total), share(not_run, total)],
        "tokens": f"{usage.get('total_tokens', 0):,}",
        "input_tokens": f"{usage.get('input_tokens', 0):,}",
        "cached_tokens": f"{(usage.get('input_tokens_details') or {}).get('cached_tokens', 0):,}",
        "cached_share": _cached_share(usage),
        "output_tokens": f"{usage.get('output_tokens', 0):,}",
        "reasoning_tokens": f"{(usage.get('output_tokens_details') or {}).get('reasoning_tokens', 0):,}",
        "cost": money(cost.get("total"), cost.get("currency")),
        "cost_input": money(cost.get("input"), cost.get("currency")),
        "cost_cached_input": money(cost.get("cached_input"), cost.get("currency")),
        "cost_output": money(cost.get("output"), cost.get("currency")),
        **_contract_counts(batch),
        "created": when(batch["created_at"]),
        "terminal": batch["status"] in TERMINAL_BATCH_STATUSES,
        "cancellable": batch["status"] in CANCELLABLE,
        # Guardrails (batches.guardrails): the pause, and the buttons that pause and resume.
        "paused": (batch.get("openrelay") or {}).get("paused"),
        "pausable": batch["status"] in PAUSABLE,
        "max_cost": money((batch.get("openrelay") or {}).get("max_cost"), "USD"),
    }


def _contract_counts(batch):
    """Output contracts' counts: records re-asked, re-asks made, records still invalid after them."""
    counts = (batch.get("openrelay") or {}).get("output_contracts") or {}
    return {name: f"{counts.get(name, 0):,}" for name in ("reasked", "reasks", "invalid_output")}


def percent(done, total, status):
    if total <= 0:
        return 100 if status in TERMINAL_BATCH_STATUSES else 0
    return min(100, done * 100 // total)


def share(part, total):
    return f"{part * 100 / total:.2f}" if total > 0 else "0"


def duration(seconds):
    """`45 s`, `3 min 20 s`, `2 h 05 min`: the time left or taken, as dashboard.js writes it too."""
    if seconds is None:
        return "\u2014"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def pace(batch, samples, now):
    """The rate and the time left (or, once finished, the average rate and the time taken)."""
    counts = batch["request_counts"]
    start = batch["in_progress_at"]
    series = progress.series(start, samples)
    end = next((batch[f] for f in ("completed_at", "cancelled_at", "expired_at", "failed_at") if batch[f]), None)
    if end is not None:
        done = series[-1][1] + series[-1][2] if series else 0
        took = end - start if start else None
        rate = done / took if took else None
        return {"rate": rate_text(rate), "eta_label": "Took", "eta": duration(took)}
    done = counts["completed"] + counts["failed"]
    rate = progress.rate(series, now, done)
    left = progress.eta_s(rate, counts["total"] - done) if start else None
    return {"rate": rate_text(rate), "eta_label": "Time left", "eta": duration(left)}


def rate_text(rate):
    return "\u2014" if rate is None else f"{rate:,.1f}/s"


def money(amount, currency):
    """A decimal string as `$0.0012`: 2 to 6 decimals; an em dash before billing has priced anything."""
    if amount is None:
        return "\u2014"
    try:
        text = re.sub(r"0{1,4}$", "", f"{Decimal(amount):.6f}")
    except (InvalidOperation, ValueError):
        return "\u2014"
    currency = (currency or "usd").lower()
    return f"${text}" if currency == "usd" else f"{text} {currency.upper()}"


def when(unix):
    if unix is None:
        return ""
    return datetime.fromtimestamp(unix, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(count):
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:,} {unit}" if unit == "bytes" else f"{count:,.1f} {unit}"
        count /= 1024


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


def retryable(batch):
    """A finished batch with error-file records (failed, expired or cancelled: request_counts
    counts them all failed) can run them again as a new batch."""
    return batch["status"] in RETRYABLE and batch["request_counts"]["failed"] > 0


def retry_label(failed, not_run):
    """What the retry button reruns, as dashboard.js `retryLabel` says it too."""
    if not not_run:
        return f"Retry {failed:,} failed record{'s' if failed != 1 else ''}"
    if not failed:
        return f"Retry {not_run:,} record{'s' if not_run != 1 else ''} not run"
    return f"Retry {failed + not_run:,} records ({failed:,} failed, {not_run:,} not run)"


def failures_fragment(batch_id, failures):
    """The failures card's inside, as the page renders it and the batch socket pushes it."""
    return render_to_string("dashboard/_failures.html", failures_context(batch_id, failures))


def failures_context(batch_id, failures):
    most = max((entry["count"] for entry in failures.codes), default=1)
    codes = [
        {**entry, "count_text": f"{entry['count']:,}", "width": f"{entry['count'] * 100 / most:.1f}"}
        for entry in failures.codes
    ]
    return {
        "batch_id": batch_id,
        "failures": failures,
        "codes": codes,
        "failed": f"{failures.failed:,}",
        "unrun": f"{failures.unrun:,}",
    }


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


@require_POST
@member_required
def batch_retry(request, batch_id):
    """A new batch of this finished batch's failed records; shows the new batch."""
    batch = _batch_or_404(request, batch_id)
    try:
        retry = services.retry_failed(batch)
    except ApiError as exc:
        messages.error(request, exc.message)
        return redirect("dashboard:batch", batch_id=batch.public_id)
    messages.success(
        request,
        f"Retrying {retry.total_count} record{'s' if retry.total_count != 1 else ''} of "
        f"{batch.public_id} as this new batch.",
    )
    return redirect("dashboard:batch", batch_id=retry.public_id)


@require_POST
@member_required
def batch_cancel(request, batch_id):
    batch = _batch_or_404(request, batch_id)
    try:
        services.cancel_batch(batch)
    except ApiError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Cancelling {batch.public_id}: records in flight stop, finished ones are kept.")
    return redirect("dashboard:batch", batch_id=batch.public_id)


@require_POST
@member_required
def batch_pause(request, batch_id):
    batch = _batch_or_404(request, batch_id)
    try:
        guardrails.pause_batch(batch)
    except ApiError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Paused {batch.public_id}: calls in flight finish; its window clock runs on.")
    return redirect("dashboard:batch", batch_id=batch.public_id)


@require_POST
@member_required
def batch_resume(request, batch_id):
    batch = _batch_or_404(request, batch_id)
    try:
        max_cost = parse_max_cost(request.POST.get("max_cost", "").strip() or None, "max_cost")
        guardrails.resume_batch(batch, max_cost_nanos=max_cost)
    except ApiError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Resumed {batch.public_id} where it stopped.")
    return redirect("dashboard:batch", batch_id=batch.public_id)


@csrf_exempt  # checked in _create_batch, once the size-capped upload handler has parsed the body
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
        batch = _create_batch(request, upload)
    except ApiError as exc:
        return _new_batch_page(request, error=exc.message, status=exc.status, fields=upload.fields)
    return redirect(reverse("dashboard:batch", args=[batch.public_id]) + "?created=1")


def _quote_page(request, upload):
    """The form again with a quote of what Create would do. A dropped file is stored and chosen in
    the form, so Create then runs what was quoted without uploading it twice."""
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
        if upload.file is not None:
            input_file_id = file_services.create_uploaded_file(
                organization=request.organization, upload=upload.file
            ).public_id
        elif fields.get("input_file_id"):
            input_file_id = fields["input_file_id"]
        else:
            raise ApiError("Choose or drop a JSONL file, or pick one you uploaded before.", param="file")
        params = parse_create_params(_form_body(fields, input_file_id))
        quote = quotes.quote_object(quotes.estimate(organization=request.organization, **vars(params)))
    except ApiError as exc:
        return _new_batch_page(request, error=exc.message, status=exc.status, fields=fields)
    return _new_batch_page(request, selected=input_file_id, fields=fields, quote=quote)


def _form_body(fields, input_file_id):
    return {
        "input_file_id": input_file_id,
        "endpoint": fields.get("endpoint") or None,
        "completion_window": "24h",
        "priority": fields.get("priority") or None,
        "metadata": _form_metadata(fields),
        "openrelay": {"max_cost": (fields.get("max_cost") or "").strip() or None},
    }


def _create_batch(request, upload):
    """Store the dropped file (or take a chosen one), then create the batch through the one create service."""
    fields = upload.fields
    if upload.problem is not None:
        upload.close()
        raise upload.problem
    stored = None
    if upload.file is not None:
        stored = file_services.create_uploaded_file(organization=request.organization, upload=upload.file)
        input_file_id = stored.public_id
    elif fields.get("input_file_id"):
        input_file_id = fields["input_file_id"]
    else:
        raise ApiError("Choose or drop a JSONL file, or pick one you uploaded before.", param="file")
    try:
        params = parse_create_params(_form_body(fields, input_file_id))
        return services.create_batch(organization=request.organization, params=params)
    except ApiError:
        if stored is not None:  # uploaded for this batch only; nothing else refers to it
            file_services.delete_file(stored)
        raise


def _form_metadata(fields):
    """The form's key/value rows as the API's `metadata` object (None when every row is empty);
    parse_create_params checks it as it checks the API's (batches.validation.params.parse_metadata)."""
    metadata = {}
    for key, value in _metadata_rows(fields):
        if not key and not value:
            continue
        if not key:
            raise ApiError(f"Metadata value '{value[:64]}' has no key: give each value a key.", param="metadata")
        if key in metadata:
            raise ApiError(f"Metadata key '{key[:64]}' is given twice: give each key once.", param="metadata")
        metadata[key] = value
    return metadata or None


def _metadata_rows(fields):
    keys = fields.getlist("metadata_key") if hasattr(fields, "getlist") else []
    values = fields.getlist("metadata_value") if hasattr(fields, "getlist") else []
    return [(key.strip(), value) for key, value in zip(keys, values, strict=False)]


def _new_batch_page(request, *, selected=None, error=None, status=200, fields=None, quote=None):
    fields = fields or {}
    rows = [row for row in _metadata_rows(fields) if row[0] or row[1]]
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
            "max_cost": fields.get("max_cost") or "",
            # What was typed comes back after an error; at least METADATA_ROWS rows to fill.
            "metadata_rows": rows + [("", "")] * max(0, METADATA_ROWS - len(rows)),
            "max_metadata": MAX_METADATA_PAIRS,
            "error": error,
            "quote": quote,
            "quote_rows": _quote_rows(quote) if quote else None,
            "nav": "new",
        },
        status=status,
    )


FITS = {True: "yes", False: "no", "at_risk": "at risk", None: "unknown"}


def _quote_rows(quote):
    """The quote as the New batch page shows it: (what, figure, how it was made) a row."""
    counts = quote["request_counts"]
    rows = [("Records", f"{counts['total']:,} accepted, {counts['rejected']:,} rejected", "create's own checks")]
    tokens, output, cost, time = (quote.get(k) for k in ("input_tokens", "output_tokens", "cost", "time"))
    if tokens:
        how = tokens["method"].replace("_", " ")
        if tokens["sampled"]:
            how += f", {tokens['counted_records']:,} of {tokens['records']:,} records counted"
        if tokens["error_pct"]:
            how += f", ±{tokens['error_pct']}%"
        rows.append(("Input tokens", f"{tokens['total']:,}", how))
    if output:
        rows.append(
            ("Output tokens", f"{output['low']:,} / {output['expected']:,} / {output['high']:,}", output["basis"])
        )
    if cost:
        rows.append(("Cost (USD)", f"{cost['low']} / {cost['expected']} / {cost['high']}", "low / expected / high"))
    if time:
        expected = time["expected_duration_s"]
        done = time["expected_completion_at"]
        rows.append(
            (
                "Done by",
                _datetime(done).strftime("%Y-%m-%d %H:%M UTC") if done else "unknown",
                f"{_duration(expected)} at the model's pace ({time['basis'].replace('_', ' ')})"
                if expected is not None
                else "no measured pace yet",
            )
        )
    rows.append(("Fits the 24 h window", FITS[quote["fits_window"]], f"confidence {quote['confidence']}"))
    return rows


def _datetime(timestamp):
    return datetime.fromtimestamp(timestamp, UTC)


def _duration(seconds):
    if seconds < 120:
        return f"{round(seconds)} s"
    if seconds < 7200:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


@require_GET
@member_required
def file_list(request):
    try:
        files, has_more = file_selectors.list_files(
            request.organization, limit=PAGE_SIZE, after=request.GET.get("after") or None
        )
    except ApiError:
        raise Http404("No such file.") from None
    rows = [_file_row(f) for f in files]
    return render(
        request,
        "dashboard/files.html",
        {
            "files": rows,
            "older": rows[-1]["id"] if has_more else None,
            "nav": "files",
        },
    )


def _file_row(file):
    row = present_file(file)
    return {**row, "size": _size(file.bytes), "created": when(row["created_at"]), "expires": when(row["expires_at"])}


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


def operator_fragment():
    """The operator page's inside, as the page renders it and the operator socket pushes it."""
    view = operator.overview()
    return render_to_string(
        "dashboard/_operator.html",
        {
            "overview": view,
            "models": [_model_row(model) for model in view.models],
            "organizations": view.organizations,
            "at": when(int(view.at.timestamp())),
        },
    )


def _model_row(model):
    deployments = [
        {
            "deployment": deployment,
            "calls": calls,
            "error_rate": _percent_text(calls.error_rate),
            "limit": calls.limit_of(deployment),
            "state": operator.state(deployment, calls),
            "load": share(min(calls.in_flight, calls.limit_of(deployment)), calls.limit_of(deployment)),
            "since": when(int(deployment.health_changed_at.timestamp())) if deployment.health_changed_at else "",
        }
        for deployment, calls in model.deployments
    ]
    return {
        "model": model,
        "deployments": deployments,
        "error_rate": _percent_text(model.calls.error_rate),
        "load": share(min(model.calls.in_flight, model.limit), model.limit),
        "a_minute": f"{model.work.a_minute:,}",
    }


def _cached_share(usage):
    """The share of input tokens the model server served from its prefix cache ("—" before any)."""
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return _percent_text(100 * cached / usage["input_tokens"] if usage.get("input_tokens") else None)


def _percent_text(value):
    return "\u2014" if value is None else f"{value:.1f}%"
