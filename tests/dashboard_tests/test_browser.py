"""The dashboard end to end in headless Chromium, against a real ASGI server and a real worker cluster.

Debian's `chromium` (apt-get install chromium) driven by the `playwright`
package; never `playwright install`. Screenshots of every step land in
<data dir>/screenshots/ (OPENRELAY_DATA_DIR, var/ by default; never committed),
so a failure can be looked at.
"""

import re
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
from django.conf import settings
from django.db import connections

from batches import live
from batches.models import Batch
from openrelay.core.models import Deployment, Model, Price
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.dashboard_tests.conftest import MODEL, chat_line, jsonl, shot, sign_in, text
from tests.helpers import make_batch

SHOTS = Path(settings.DATA_DIR) / "screenshots"
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "browser-test-password"
FAST_RECORDS, SLOW_RECORDS = 60, 40
CREATED = re.compile(r"/batches/batch_[^/?]+(\?created=1)?$")  # dashboard.js drops ?created=1 once shown

pytestmark = pytest.mark.slow


def _announce(batch_pk):
    try:
        live.batch_changed_sync(batch_pk)
    finally:
        connections.close_all()  # this thread's own connection; a left-open one blocks dropping the test database


# Daphne's own server first: the next test shares `live_stack` with test_browser_insight's first three
# (the stack runs while consecutive tests take it).
def test_daphne_serves_the_pages_static_files_and_live_updates(member, processes, browser):
    """The same application under daphne: static files through WhiteNoise and a live websocket."""
    page = browser
    url = processes.web("daphne")
    sign_in(page, url)
    assert page.evaluate("getComputedStyle(document.querySelector('.top')).display") == "flex"  # CSS loaded
    batch = make_batch(member, total=8, completed=2)
    page.goto(f"{url}/batches/{batch.public_id}")
    page.wait_for_selector("[data-live].open")
    assert text(page, ".stats [data-field=counts]") == "2 / 8"
    # The change a worker makes: the database row, and (with Redis) the pushed event.
    Batch.objects.filter(pk=batch.pk).update(completed_count=6)
    with ThreadPoolExecutor(1) as thread:  # async_to_sync refuses the thread Playwright's loop runs in
        thread.submit(_announce, batch.pk).result()
    page.wait_for_function("() => document.querySelector('.stats [data-field=counts]').textContent === '6 / 8'")
    assert text(page, ".stats [data-field=percent]") == "75%"
    shot(page, "10-daphne")


def test_it_uploads_creates_watches_live_downloads_and_cancels(member, live_stack, browser, tmp_path):
    page = browser
    with run_in_thread(SimulatorConfig()) as sim:
        model = Model.objects.create(name=MODEL)
        Deployment.objects.create(model=model, base_url=sim.base_url, max_concurrency=4)
        Price.objects.create(model=model, input_per_mtok="0.20", cached_input_per_mtok="0.05", output_per_mtok="0.80")
        url = live_stack.url

        sign_in(page, url)
        assert "No batches yet" in text(page, "tbody")
        shot(page, "02-batches-empty")

        # Upload and create: 60 records that take ~2 s in all, plus two the create rejects.
        requests = tmp_path / "requests.jsonl"
        requests.write_bytes(
            jsonl(
                *[chat_line(f"fast-{i}", f"question {i} [[latency:150]]") for i in range(FAST_RECORDS)],
                b'{"custom_id": "broken"',
                chat_line("fast-0"),
            )
        )
        page.click("nav >> text=New batch")
        page.wait_for_selector("[data-drop]")
        page.set_input_files("input[name=file]", str(requests))
        page.select_option("#endpoint", "/v1/chat/completions")
        page.select_option("#priority", "standard")
        shot(page, "03-new-batch")
        page.click("[data-submit]")
        page.wait_for_url(CREATED)
        summary = text(page, "[data-created-summary]")
        assert f"{FAST_RECORDS} records accepted, 2 rejected" in summary
        assert page.locator("[data-rejections] tbody tr").count() == 2
        shot(page, "04-created")

        # Watch it finish without a reload: the page's own DOM changes under the pushes.
        page.evaluate("""() => {
            window.__notReloaded = true;
            window.__widths = [];
            const bar = document.querySelector('[data-field="bar"]');
            new MutationObserver(() => window.__widths.push(bar.style.width)).observe(bar, {attributes: true});
        }""")
        page.wait_for_selector("[data-live].open")
        page.wait_for_function("() => window.__widths.some(w => w !== '0%' && w !== '100%')")
        shot(page, "05-running")
        page.wait_for_function(
            "() => document.querySelector('.page-head [data-field=status]').textContent === 'completed'", timeout=30_000
        )
        assert page.evaluate("window.__notReloaded") is True
        assert page.locator("[data-field=bar]").first.get_attribute("style") == "width: 100%;"
        assert text(page, ".stats [data-field=counts]") == f"{FAST_RECORDS} / {FAST_RECORDS}"
        assert int(text(page, ".stats [data-field=tokens]").replace(",", "")) > 0
        assert int(page.get_attribute("[data-chart]", "data-points")) >= 3
        assert not page.locator("[data-role=cancel]").is_visible()
        page.wait_for_selector("[data-file=output_file_id]:not([hidden])")
        shot(page, "06-completed")

        # Download the output.
        with page.expect_download() as download:
            page.click("[data-file=output_file_id]")
        lines = [orjson.loads(line) for line in Path(download.value.path()).read_bytes().splitlines()]
        assert sorted(line["custom_id"] for line in lines) == sorted(f"fast-{i}" for i in range(FAST_RECORDS))
        assert all(line["response"]["status_code"] == 200 for line in lines)

        # A second, slow batch, dropped onto the drop zone; the batches page follows it live.
        slow = jsonl(*[chat_line(f"slow-{i}", f"slow {i} [[latency:1000]]") for i in range(SLOW_RECORDS)])
        page.click("nav >> text=New batch")
        page.wait_for_selector("[data-drop]")
        page.evaluate(
            """(content) => {
            const data = new DataTransfer();
            data.items.add(new File([content], "slow.jsonl", {type: "application/jsonl"}));
            document.querySelector('[data-drop]').dispatchEvent(new DragEvent('drop', {dataTransfer: data, bubbles: true}));
        }""",
            slow.decode(),
        )
        assert "slow.jsonl" in text(page, "[data-file-name]")
        shot(page, "07-dropped")
        page.click("[data-submit]")
        page.wait_for_url(CREATED)
        slow_id = page.url.split("/batches/")[1].split("?")[0]

        page.click("nav >> text=Batches")
        page.wait_for_selector("[data-live].open")
        page.evaluate("window.__notReloaded = true")
        row = f"tr[data-batch='{slow_id}']"
        page.wait_for_function(f"""() => {{
            const counts = document.querySelector("{row} [data-field=counts]").textContent;
            return parseInt(counts, 10) > 0;
        }}""")
        assert page.evaluate("window.__notReloaded") is True
        assert text(page, f"{row} [data-field=status]") == "in_progress"
        shot(page, "08-batches-live")

        # Cancel it from its page; the page follows it to cancelled.
        page.click(f"{row} [data-field=link]")
        page.wait_for_selector("[data-live].open")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("[data-role=cancel] button")
        page.wait_for_selector(".flash.success")
        page.wait_for_function(
            "() => document.querySelector('.page-head [data-field=status]').textContent === 'cancelled'", timeout=30_000
        )
        page.wait_for_selector("[data-file=error_file_id]:not([hidden])")
        shot(page, "09-cancelled")
        batch = Batch.objects.get(public_id=slow_id)
        assert batch.status == "cancelled" and batch.completed_count < SLOW_RECORDS
        assert text(page, ".stats [data-field=completed]") == str(batch.completed_count)


def test_the_new_batch_page_picks_a_window_by_its_price_and_fit(member, processes, browser, tmp_path, settings):
    """Two offered windows: each with its share of the sync price (from the settings, then from the
    quote with whether it fits); the one picked is marked, kept through the quote, and created."""
    settings.OPENRELAY_COMPLETION_WINDOWS = "60s:0.8,24h:0.5"  # this process's (the test's quote rows)
    page = browser
    model = Model.objects.create(name=MODEL)
    Deployment.objects.create(model=model, base_url="http://127.0.0.1:9", max_concurrency=4)
    Price.objects.create(model=model, input_per_mtok="0.20", cached_input_per_mtok="0.05", output_per_mtok="0.80")
    url = processes.web("uvicorn", OPENRELAY_COMPLETION_WINDOWS="60s:0.8,24h:0.5")
    sign_in(page, url)
    page.click("nav >> text=New batch")
    page.wait_for_selector("[data-windows]")
    assert page.locator("#completion_window option").all_inner_texts() == [
        "60s (80% of the sync price)",
        "24h (50% of the sync price)",
    ]
    assert text(page, "[data-window-row='60s'] [data-share]") == "80% of the sync price"
    assert text(page, "[data-window-row='24h'] [data-fits]") == "get a quote"
    assert page.get_attribute("[data-window-row='24h']", "aria-current") == "true"  # the default window
    page.select_option("#completion_window", "60s")
    assert page.get_attribute("[data-window-row='60s']", "aria-current") == "true"
    assert page.get_attribute("[data-window-row='24h']", "aria-current") is None
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(jsonl(*[chat_line(f"w-{i}", f"question {i}") for i in range(5)]))
    page.set_input_files("input[name=file]", str(requests))
    page.click("[data-quote-button]")
    page.wait_for_selector("[data-quote]")
    shot(page, "20-new-batch-windows-quoted")
    # The quote's windows: what each would cost at its rate (60 s dearer than 24 h), whether it fits.
    assert page.input_value("#completion_window") == "60s"
    costs = {w: float(text(page, f"[data-window-row='{w}'] td.num")) for w in ("60s", "24h")}
    assert costs["60s"] == pytest.approx(costs["24h"] * 0.8 / 0.5, rel=0.02) and costs["24h"] > 0
    assert text(page, "[data-window-row='60s'] [data-fits]") in ("yes", "no", "at risk", "unknown")
    assert "Fits the 60s window" in text(page, "[data-quote]")
    page.click("[data-submit]")
    page.wait_for_url(CREATED)
    batch = Batch.objects.get(organization=member)
    assert batch.completion_window == "60s" and (batch.expires_at - batch.created_at).total_seconds() == 60
    assert batch.price_multiplier == Decimal("0.8")
    assert text(page, ".stats [data-field=first_result]") == "\u2014"  # no record has ended yet
