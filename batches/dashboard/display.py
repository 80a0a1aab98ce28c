"""What the dashboard's pages show: a Batch object, a quote, a file and the operator's figures as text.

The one home of the dashboard's formats (numbers with thousands separators, money, times,
durations, shares). Pages render these; the websockets (batches.dashboard.consumers) send
the same strings (`live_fields`), so static/dashboard/dashboard.js writes what it is given.
Only the batch page's chart formats in the browser: its rate, time left and axis move every
second between pushes.
"""

import re
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from django.template.loader import render_to_string

from batches import operator, progress, windows
from batches.lifecycle import PAUSABLE
from batches.models import TERMINAL_BATCH_STATUSES, BatchStatus
from files.presenters import present_file

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
CANCELLABLE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
RETRYABLE = (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)


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
        **_reuse_counts(batch),
        "created": when(batch["created_at"]),
        "terminal": batch["status"] in TERMINAL_BATCH_STATUSES,
        "cancellable": batch["status"] in CANCELLABLE,
        # Guardrails (batches.guardrails): the pause, and the buttons that pause and resume.
        "paused": (batch.get("openrelay") or {}).get("paused"),
        "pausable": batch["status"] in PAUSABLE,
        "max_cost": money((batch.get("openrelay") or {}).get("max_cost"), "USD"),
        # Published latency (batches.latency): from create to the first result, and to completion.
        "first_result": duration((batch.get("openrelay") or {}).get("time_to_first_result")),
        "time_to_complete": duration((batch.get("openrelay") or {}).get("time_to_complete")),
    }


def live_fields(batch, not_run=0):
    """What a websocket push writes into the page's `[data-field]` nodes, keyed by field: the
    strings `display` renders, so static/dashboard/dashboard.js formats nothing of its own."""
    shown = display(batch, not_run)
    counts = batch["request_counts"]
    fields = {name: shown[name] for name in LIVE_FIELDS}
    fields.update(
        {
            "id": batch["id"],
            "endpoint": batch["endpoint"],
            "model": batch.get("model") or "",
            "status": batch["status"],
            "percent": f"{shown['percent']}%",
            **{
                name: f"{width}%"
                for name, width in zip(("bar", "bar_failed", "bar_not_run"), shown["bar"], strict=True)
            },
            "retry_label": retry_label(counts["failed"] - not_run, not_run),
            **{field: when(batch.get(field)) for field, _ in TIMELINE},
        }
    )
    if shown["paused"]:
        fields["paused_since"] = when(shown["paused"].get("since"))
    return fields


# The fields of `display` a push sends as they are.
LIVE_FIELDS = (
    "counts",
    "completed",
    "failed",
    "not_run",
    "tokens",
    "input_tokens",
    "cached_tokens",
    "cached_share",
    "output_tokens",
    "reasoning_tokens",
    "cost",
    "cost_input",
    "cost_cached_input",
    "cost_output",
    "reasked",
    "reasks",
    "invalid_output",
    "reused",
    "cache_hits",
    "saved_tokens",
    "created",
    "first_result",
    "time_to_complete",
)


def _contract_counts(batch):
    """Output contracts' counts: records re-asked, re-asks made, records still invalid after them."""
    counts = (batch.get("openrelay") or {}).get("output_contracts") or {}
    return {name: f"{counts.get(name, 0):,}" for name in ("reasked", "reasks", "invalid_output")}


def _reuse_counts(batch):
    """Reuse's counts (batches.reuse): lines answered with a reused answer, of which from the answer
    cache, and the tokens they did not cost; and the batch's mode."""
    reuse = (batch.get("openrelay") or {}).get("reuse") or {}
    saved = reuse.get("saved_input_tokens", 0) + reuse.get("saved_output_tokens", 0)
    return {
        "reuse_mode": reuse.get("mode", "auto"),
        "reused": f"{reuse.get('reused', 0):,}",
        "cache_hits": f"{reuse.get('cache_hits', 0):,}",
        "saved_tokens": f"{saved:,}",
    }


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


def size(count):
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:,} {unit}" if unit == "bytes" else f"{count:,.1f} {unit}"
        count /= 1024


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


FITS = {True: "yes", False: "no", "at_risk": "at risk", None: "unknown"}


def quote_rows(quote):
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
    rows.append(
        (
            f"Fits the {quote['completion_window']} window",
            FITS[quote["fits_window"]],
            f"confidence {quote['confidence']}",
        )
    )
    return rows


def window_rows(quote, selected):
    """The New batch page's windows: (name, its share of the sync price, the quote's expected cost or
    None, whether it fits or None before a quote, whether it is the one picked) a row. From the quote's
    `windows` once there is one (the batch's priority priced in), else from the offered windows."""
    if quote:
        return [
            (
                w["window"],
                _share_text(w["multiplier"]),
                w["cost"].get("expected"),
                FITS[w["fits_window"]],
                w["window"] == selected,
            )
            for w in quote["windows"]
        ]
    return [(w.name, _share_text(w.rate), None, None, w.name == selected) for w in windows.offered()]


def _share_text(rate):
    """A window's rate (0.8, "0.65") as its share of the sync price: 80%, 65%."""
    return f"{float(rate) * 100:g}%"


def _datetime(timestamp):
    return datetime.fromtimestamp(timestamp, UTC)


def _duration(seconds):
    if seconds < 120:
        return f"{round(seconds)} s"
    if seconds < 7200:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def file_row(file):
    row = present_file(file)
    return {**row, "size": size(file.bytes), "created": when(row["created_at"]), "expires": when(row["expires_at"])}


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
