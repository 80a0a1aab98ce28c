"""One truth per screen (issue 40), in headless Chromium against a real ASGI server and worker cluster.

One batch created through the form (with metadata) is watched running, cancelled and retried; at
every moment the page samples, the failures card's badges equal the Failed and Not run tiles and
the card's codes add up to them. Then the banner after a reload, the API object's metadata, the
favicon, and the pages at 390 px. Screenshots land in <data dir>/screenshots/<test>/.
"""

import re

import httpx
import pytest

from batches.models import Batch
from openrelay.core.models import ApiKey
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.dashboard_tests.conftest import catalog, chat_line, jsonl, sign_in, text

pytestmark = pytest.mark.slow
RECORDS = 48
BATCH_URL = re.compile(r"/batches/batch_[^/?]+$")

# Sampled in the page every 40 ms, and on every change of the card: [tile failed, tile not run,
# badge failed (or null when hidden), badge not run, the card's total] whenever they disagree.
WATCH = """() => {
    window.__disagreements = [];
    window.__samples = 0;
    const value = (selector) => {
        const node = document.querySelector(selector);
        return node ? Number(node.textContent.replace(/,/g, "")) : null;
    };
    const shown = (kind) => {
        const badge = document.querySelector('[data-badge="' + kind + '"]');
        return badge.hidden ? 0 : Number(badge.querySelector("[data-field]").textContent.replace(/,/g, ""));
    };
    const check = () => {
        window.__samples += 1;
        const failed = value('.stats [data-field="failed"]');
        const notRun = document.querySelector(".stats [data-not-run]").hidden ? 0 : value('.stats [data-field="not_run"]');
        const card = document.querySelector("[data-failures-total]");
        const total = card ? Number(card.dataset.failuresTotal) : 0;
        if (shown("failed") !== failed || shown("not_run") !== notRun || total !== failed + notRun) {
            window.__disagreements.push([failed, notRun, shown("failed"), shown("not_run"), total]);
        }
    };
    setInterval(check, 40);
    new MutationObserver(check).observe(document.querySelector("article"), {subtree: true, childList: true, characterData: true});
}"""


def body(i):
    if i % 4 == 1:
        return chat_line(f"r-{i}", f"bad {i} [[status:400]] [[latency:150]]")
    return chat_line(f"r-{i}", f"q {i} [[latency:350]]")


def watch_until(page, status):
    page.wait_for_selector("[data-live].open")
    page.evaluate(WATCH)
    page.wait_for_function(
        f"() => document.querySelector('.page-head [data-field=status]').textContent === '{status}'", timeout=60_000
    )


def test_running_cancelled_and_retried_batches_show_one_truth(member, live_stack, browser, shots, tmp_path):
    page = browser
    _, key = ApiKey.issue(member, name="browser")
    with run_in_thread(SimulatorConfig()) as sim:
        catalog(sim, concurrency=2)
        url = live_stack.url
        sign_in(page, url)

        # Create through the form, with metadata (three pairs: one row added by the form's button).
        requests = tmp_path / "one-truth.jsonl"
        requests.write_bytes(jsonl(*[body(i) for i in range(RECORDS)]))
        page.click("nav >> text=New batch")
        page.set_input_files("input[name=file]", str(requests))
        page.click("[data-add-pair]")
        keys, values = page.locator("input[name=metadata_key]"), page.locator("input[name=metadata_value]")
        assert keys.count() == 3
        for i, (k, v) in enumerate((("team", "vision"), ("run", "nightly 7"), ("owner", "ada"))):
            keys.nth(i).fill(k)
            values.nth(i).fill(v)
        shots(page, "01-new-batch-with-metadata")
        page.click("[data-submit]")
        page.wait_for_selector("[data-created-summary]")
        # The banner shows once: ?created=1 is gone from the address, so a reload leaves it out.
        page.wait_for_url(BATCH_URL)
        batch_id = page.url.rsplit("/", 1)[1]
        pairs = dict(
            zip(page.locator(".metadata th").all_inner_texts(), page.locator(".metadata td").all_inner_texts())
        )
        assert pairs == {"owner": "ada", "run": "nightly 7", "team": "vision"}

        # Running: the badge is the Failed tile at every moment sampled; then cancel it mid-way.
        page.wait_for_selector("[data-live].open")
        page.evaluate(WATCH)
        page.wait_for_function("() => Number(document.querySelector('.stats [data-field=failed]').textContent) >= 3")
        page.wait_for_function("() => window.__samples >= 10")
        assert page.evaluate("window.__disagreements") == []
        shots(page, "02-running")
        assert page.evaluate(
            "getComputedStyle(document.querySelector('.bar [data-field=bar]')).backgroundColor"
        ) == page.evaluate("getComputedStyle(document.querySelector('.legend .key.ok')).backgroundColor")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("[data-role=cancel] button")
        page.wait_for_selector(".flash.success")
        watch_until(page, "cancelled")
        page.wait_for_selector(".stats [data-not-run]:not([hidden])")
        page.wait_for_selector("[data-failures] tr[data-code=batch_cancelled].unrun")
        shots(page, "03-cancelled")
        batch = Batch.objects.get(public_id=batch_id)
        failed, not_run = int(text(page, ".stats [data-field=failed]")), int(text(page, ".stats [data-field=not_run]"))
        assert failed + not_run == batch.failed_count and failed > 0 and not_run > 0
        assert text(page, "[data-badge=failed]") == f"{failed} failed"
        assert text(page, "[data-badge=not_run]") == f"{not_run} not run"
        label = f"Retry {failed + not_run} records ({failed} failed, {not_run} not run)"
        assert text(page, "[data-role=retry] button") == label
        assert page.evaluate("window.__disagreements") == [] and page.evaluate("window.__samples") > 0

        # A reload: no banner; the same figures rendered by the server.
        page.reload()
        page.wait_for_selector("[data-live].open")
        assert page.locator("[data-created-summary]").count() == 0
        assert text(page, "[data-badge=not_run]") == f"{not_run} not run"
        assert text(page, "[data-role=retry] button") == label

        # The API object carries the form's metadata.
        answer = httpx.get(f"{url}/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200
        assert answer.json()["metadata"] == {"team": "vision", "run": "nightly 7", "owner": "ada"}

        # Retried: the failed and not-run records run again; the 400s fail again, the rest complete.
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("[data-role=retry] button")
        page.wait_for_selector(".flash.success")
        assert f"Retrying {failed + not_run} records" in text(page, ".flash.success")
        watch_until(page, "completed")
        retry = Batch.objects.get(public_id=page.url.rsplit("/", 1)[1])
        page.wait_for_function(
            f"() => document.querySelector('.stats [data-field=failed]').textContent === '{retry.failed_count}'"
        )
        assert 0 < retry.failed_count < retry.total_count
        assert text(page, "[data-badge=failed]") == f"{retry.failed_count} failed"
        assert page.locator("[data-badge=not_run]").is_hidden()
        page.wait_for_selector("[data-role=retry]:not([hidden])")
        assert text(page, "[data-role=retry] button") == f"Retry {retry.failed_count} failed records"
        assert page.evaluate("window.__disagreements") == []
        shots(page, "04-retried")

        # The favicon, linked and served.
        icon = page.get_attribute("link[rel=icon]", "href")
        served = page.request.get(url + icon)
        assert served.status == 200 and served.headers["content-type"].startswith("image/svg+xml")
        assert b"<svg" in served.body()

        # At 390 px wide nothing is wider than the screen: the list, a batch page, the form.
        page.set_viewport_size({"width": 390, "height": 844})
        for path, name in (
            ("/", "05-list-390"),
            (f"/batches/{batch_id}", "06-batch-390"),
            ("/batches/new", "07-new-390"),
        ):
            page.goto(url + path)
            assert page.evaluate("document.documentElement.scrollWidth") <= 390, path
            shots(page, name)
