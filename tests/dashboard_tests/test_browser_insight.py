"""What the dashboard answers, seen in headless Chromium against a real ASGI server and worker cluster:
rate and time left, failures by code, not-run records, stored progress after a reload, Retry live,
search and filters, the operator page, and pages that fit 1,280 px.

Screenshots of every page land in <data dir>/screenshots/<test>/ (never committed).
"""

import re
from pathlib import Path

import orjson
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from batches import services
from batches.models import Batch
from batches.validation.params import CreateParams
from billing.models import LedgerEntry
from files import services as file_services
from openrelay.core.models import Membership, Model
from openrelay.simulator.config import SimulatorConfig
from openrelay.simulator.server import run_in_thread
from tests.dashboard_tests.conftest import CHAT, MODEL, PASSWORD, catalog, chat_line, jsonl, sign_in, text
from tests.helpers import make_batch, wait_for

pytestmark = pytest.mark.slow
CREATED = re.compile(r"/batches/batch_[^/?]+(\?created=1)?$")  # dashboard.js drops ?created=1 once shown
STAFF = "root"


@pytest.fixture
def staff(member):
    user = get_user_model().objects.create_user(STAFF, password=PASSWORD, is_staff=True, is_superuser=True)
    Membership.objects.create(user=user, organization=member)
    return user


def sign_in_as(page, url, username):
    page.goto(url + "/login")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(url + "/")


def error_codes(lines):
    codes = {}
    for line in lines:
        line = orjson.loads(line)
        code = line["error"]["code"] if line["error"] else f"http_{line['response']['status_code']}"
        codes[code] = codes.get(code, 0) + 1
    return codes


def shown_failures(page):
    return {
        row.get_attribute("data-code"): int(row.locator("[data-count]").inner_text().replace(",", ""))
        for row in page.locator("[data-failures] tr[data-code]").all()
    }


def download(page, selector):
    with page.expect_download() as info:
        page.click(selector)
    return Path(info.value.path()).read_bytes().splitlines()


def test_batch_page_live_rate_eta_failures_retry_and_the_chart_after_reload(member, live_stack, browser, shots):
    page = browser
    records = 160
    with run_in_thread(SimulatorConfig()) as sim:
        catalog(sim, concurrency=4)
        url = live_stack.url
        sign_in(page, url)

        def body(i):
            if i % 10 == 3:
                return chat_line(f"r-{i}", f"bad {i} [[status:400]]")
            if i % 25 == 7:
                return chat_line(f"r-{i}", f"gone {i} [[status:404]]")
            return chat_line(f"r-{i}", f"q {i} [[latency:200]]")

        requests = Path(settings.DATA_DIR) / f"insight-{member.pk}.jsonl"
        requests.write_bytes(jsonl(*[body(i) for i in range(records)]))
        page.click("nav >> text=New batch")
        page.set_input_files("input[name=file]", str(requests))
        page.click("[data-submit]")
        page.wait_for_url(CREATED)
        batch_id = page.url.split("/batches/")[1].split("?")[0]
        assert page.locator("[data-role=retry]").is_hidden()

        # Watch it run: every rate and time left the page shows, collected in the page itself.
        page.evaluate("""() => {
            window.__notReloaded = true;
            window.__seen = {rate: [], eta: []};
            for (const name of ["rate", "eta"]) {
                const node = document.querySelector('.stats [data-field="' + name + '"]');
                new MutationObserver(() => window.__seen[name].push(node.textContent))
                    .observe(node, {childList: true, characterData: true, subtree: true});
            }
        }""")
        page.wait_for_selector("[data-live].open")
        page.wait_for_function(
            "() => /left/i.test(document.querySelector('[data-field=eta_label]').textContent) && "
            "/\\d/.test(document.querySelector('.stats [data-field=eta]').textContent)"
        )
        shots(page, "01-running-rate-and-eta")
        page.wait_for_function(
            "() => document.querySelector('.page-head [data-field=status]').textContent === 'completed'", timeout=60_000
        )
        seen = page.evaluate("window.__seen")
        rates = {r for r in seen["rate"] if re.fullmatch(r"[\d,.]+/s", r)}
        etas = {e for e in seen["eta"] if re.search(r"\d", e)}
        assert len(rates) >= 3 and len(etas) >= 3, seen

        # Finished, without a reload: Retry and the downloads appear, the failures card is final.
        page.wait_for_selector("[data-role=retry]:not([hidden])")
        page.wait_for_selector("[data-file=output_file_id]:not([hidden])")
        page.wait_for_selector("[data-file=error_file_id]:not([hidden])")
        assert page.evaluate("window.__notReloaded") is True
        batch = Batch.objects.get(public_id=batch_id)
        page.wait_for_function(
            f"() => Number(document.querySelector('[data-failures-total]')?.dataset.failuresTotal) "
            f"=== {batch.failed_count}"
        )
        assert page.text_content("[data-field=eta_label]") == "Took"
        shots(page, "02-completed-live")
        error_file = download(page, "[data-file=error_file_id]")
        assert shown_failures(page) == error_codes(error_file) == {"http_400": 16, "http_404": 7}
        bars = {
            code: page.get_attribute(f"[data-failures] tr[data-code={code}] svg rect", "width")
            for code in ("http_400", "http_404")
        }
        assert bars == {"http_400": "100.0", "http_404": "43.8"}  # drawn against the most common code
        lines_400 = download(page, "[data-failures] tr[data-code=http_400] a")
        assert len(lines_400) == 16
        assert {orjson.loads(line)["response"]["status_code"] for line in lines_400} == {400}

        # A reload draws the stored progress: the curve ends at the finish time, at the axis' end.
        page.reload()
        page.wait_for_selector("[data-live].open")
        chart = page.locator("[data-chart]")
        assert float(chart.get_attribute("data-t1")) == int(batch.completed_at.timestamp())
        assert float(chart.get_attribute("data-t0")) == int(batch.in_progress_at.timestamp())
        points = page.get_attribute("[data-chart-line]", "points").split()
        assert len(points) >= 4  # the start, samples taken as it ran, the finish
        assert points[-1].startswith("950.0,")
        ys = [float(p.split(",")[1]) for p in points]
        assert ys == sorted(ys, reverse=True)  # completed only grows
        assert "finished" in page.text_content("[data-chart-end]")
        assert page.text_content("[data-field=eta_label]") == "Took"
        shots(page, "03-after-reload")

        # Retry runs the failed records as a new batch.
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("[data-role=retry] button")
        page.wait_for_selector(".flash.success")
        assert "Retrying 23 records" in text(page, ".flash.success")
        shots(page, "04-retry")


def test_a_cancelled_batch_shows_done_failed_and_not_run_apart(member, live_stack, browser, shots):
    page = browser
    with run_in_thread(SimulatorConfig()) as sim:
        catalog(sim, concurrency=2)
        url = live_stack.url
        sign_in(page, url)
        requests = [chat_line(f"s-{i}", f"slow {i} [[latency:600]]") for i in range(60)]
        batch = services.create_batch(organization=member, params=CreateParams(endpoint=CHAT, requests=requests))
        page.goto(f"{url}/batches/{batch.public_id}")
        page.wait_for_selector("[data-live].open")
        page.wait_for_function(
            "() => parseInt(document.querySelector('.stats [data-field=completed]').textContent) > 0"
        )
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("[data-role=cancel] button")
        page.wait_for_selector(".flash.success")
        page.wait_for_function(
            "() => document.querySelector('.page-head [data-field=status]').textContent === 'cancelled'", timeout=30_000
        )
        page.wait_for_selector(".stats [data-not-run]:not([hidden])")
        batch.refresh_from_db()
        not_run = int(text(page, ".stats [data-field=not_run]").replace(",", ""))
        completed = int(text(page, ".stats [data-field=completed]"))
        assert completed == batch.completed_count and not_run == batch.failed_count > 0
        assert text(page, ".stats [data-field=failed]") == "0"
        assert int(text(page, ".stats [data-field=percent]").rstrip("%")) < 100
        assert page.locator("[data-field=bar_not_run]").first.get_attribute("style") != "width: 0%;"
        page.wait_for_selector("[data-failures] tr[data-code=batch_cancelled].unrun")
        shots(page, "01-cancelled")
        page.goto(url + "/")
        row = f"tr[data-batch='{batch.public_id}']"
        assert text(page, f"{row} [data-field=not_run]") == str(not_run)
        shots(page, "02-list")


def test_the_operator_page_is_live_for_staff_and_refused_to_members(member, staff, live_stack, browser, shots):
    page = browser
    with run_in_thread(SimulatorConfig()) as sim:
        model = catalog(sim, concurrency=3)
        deployment = model.deployments.get()
        url = live_stack.url

        sign_in(page, url)  # ada: a member, not an operator
        assert page.locator("nav >> text=Operator").count() == 0
        response = page.goto(url + "/operator")
        assert response.status == 403
        shots(page, "01-refused")
        page.context.clear_cookies()  # signed out

        sign_in_as(page, url, STAFF)
        page.click("nav >> text=Operator")
        page.wait_for_url(url + "/operator")
        page.wait_for_selector("[data-live].open")
        row = f"tr[data-deployment='{deployment.pk}']"
        assert text(page, f"{row} [data-field=health]") == "healthy"
        assert text(page, f"{row} [data-field=in_flight]") == "0"
        page.evaluate("window.__notReloaded = true")

        # Every tenth record is refused by the model (400): the record's error, not the deployment's.
        requests = [
            chat_line(f"o-{i}", f"slow {i} [[latency:700]]" + (" [[status:400]]" if i % 10 == 0 else ""))
            for i in range(30)
        ]
        batch = services.create_batch(organization=member, params=CreateParams(endpoint=CHAT, requests=requests))
        page.wait_for_function(
            f'() => Number(document.querySelector("{row} [data-field=in_flight]").textContent) > 0', timeout=20_000
        )
        page.wait_for_selector(f"[data-running-batch='{batch.public_id}']")
        assert int(text(page, f"{row} [data-field=in_flight]")) <= 3  # never past the deployment's limit
        # The model's queue: records neither finished nor claimed, 30 at most, drained as it runs.
        queued = f"tbody[data-model='{MODEL}'] [data-field=queued]"
        page.wait_for_function(f'() => Number(document.querySelector("{queued}").textContent) > 0')
        assert int(text(page, queued)) <= 30
        # Calls counted as they are answered (each engine's last minute, summed), within the 30 made.
        page.wait_for_function(
            f'() => Number(document.querySelector("{row} [data-field=calls_a_minute]").textContent) > 0'
        )
        assert int(text(page, f"{row} [data-field=calls_a_minute]")) <= 30
        shots(page, "02-running")
        wait_for(lambda: Batch.objects.get(pk=batch.pk).status == "completed", 60, "the batch to complete")
        page.wait_for_selector("[data-no-running]", timeout=20_000)
        page.wait_for_function(f"() => document.querySelector(\"{row} [data-field=in_flight]\").textContent === '0'")
        assert page.evaluate("window.__notReloaded") is True
        # Every call of the batch, answered within the last minute (the model's lane has closed by now or soon).
        page.wait_for_function(
            f"() => document.querySelector(\"{row} [data-field=calls_a_minute]\").textContent === '30'"
        )
        # The 3 refused of the 30 calls are counted as calls, not as the deployment failing.
        assert text(page, f"{row} [data-field=error_rate]") == "0.0%"
        assert page.locator(f"{row} [data-field=state]").count() == 0
        assert text(page, queued) == "0"
        shots(page, "03-idle")


# Last: the tests without a cluster, after those sharing `live_stack` (with test_browser's first).
def test_search_finds_a_batch_by_metadata_and_the_filters_stay_in_the_url(member, processes, browser, shots):
    page = browser
    Model.objects.create(name=MODEL)
    wanted = make_batch(member, status="completed", completed=10, metadata={"team": "vision", "job": "menus"})
    make_batch(member, metadata={"team": "search"})
    embedding = make_batch(
        member, endpoint="/v1/embeddings", model_name="openrelay/embed-small", metadata={"team": "vision"}
    )
    for i in range(52):
        make_batch(member, status="completed", completed=10, metadata={"run": "nightly", "n": str(i)})
    url = processes.web("uvicorn")
    sign_in(page, url)
    shots(page, "01-list")

    page.fill("input[name=q]", "team=vision")
    page.press("input[name=q]", "Enter")
    page.wait_for_url(re.compile(r"q=team%3Dvision"))
    assert page.locator("tbody[data-rows] tr[data-batch]").count() == 2
    page.select_option("select[name=status]", "completed")
    page.click(".filters button[type=submit]")
    page.wait_for_url(re.compile(r"status=completed"))
    rows = page.locator("tbody[data-rows] tr[data-batch]")
    assert rows.count() == 1 and rows.first.get_attribute("data-batch") == wanted.public_id
    shots(page, "02-search-and-filter")
    page.reload()  # the state is in the URL
    assert page.input_value("input[name=q]") == "team=vision"
    assert page.locator("tbody[data-rows] tr[data-batch]").count() == 1

    # The batch found shows its metadata on its own page.
    page.click(f"tr[data-batch='{wanted.public_id}'] a")
    page.wait_for_url(re.compile(rf"/batches/{wanted.public_id}$"))
    pairs = dict(zip(page.locator(".metadata th").all_inner_texts(), page.locator(".metadata td").all_inner_texts()))
    assert pairs == {"team": "vision", "job": "menus"}
    shots(page, "03-metadata")
    page.go_back()

    # Endpoint and model filters, kept in the URL with the search.
    page.select_option("select[name=status]", "")
    page.select_option("select[name=endpoint]", "/v1/embeddings")
    page.click(".filters button[type=submit]")
    page.wait_for_url(re.compile(r"endpoint=%2Fv1%2Fembeddings"))
    rows = page.locator("tbody[data-rows] tr[data-batch]")
    assert rows.count() == 1 and rows.first.get_attribute("data-batch") == embedding.public_id
    page.select_option("select[name=endpoint]", "")
    page.select_option("select[name=model]", MODEL)
    page.click(".filters button[type=submit]")
    page.wait_for_url(re.compile(r"model=openrelay%2F"))
    assert "q=team%3Dvision" in page.url
    rows = page.locator("tbody[data-rows] tr[data-batch]")
    assert rows.count() == 1 and rows.first.get_attribute("data-batch") == wanted.public_id

    page.goto(url + "/?q=nightly")
    assert page.locator("tbody[data-rows] tr[data-batch]").count() == 50
    page.click("[data-page=older]")
    page.wait_for_url(re.compile(r"after=batch_"))
    assert "q=nightly" in page.url and page.input_value("input[name=q]") == "nightly"
    assert page.locator("tbody[data-rows] tr[data-batch]").count() == 2
    shots(page, "04-older-page")
    page.click("[data-page=newer]")
    page.wait_for_url(re.compile(r"before=batch_"))
    assert page.locator("tbody[data-rows] tr[data-batch]").count() == 50


def test_the_files_page_and_the_admin_lists_fit_1280_px(member, staff, processes, browser, shots):
    page = browser
    Model.objects.create(name=MODEL)
    for i in range(3):
        file_services.create_file_from_chunks(
            organization=member,
            filename=f"invoices-2026-q4-scanned-pages-batch-{i:03d}-with-a-long-name.jsonl",
            purpose="batch",
            chunks=[b'{"custom_id": "a"}\n' * (1000 * (i + 1))],
            expires_at=file_services.default_expiry("batch"),
        )
    for _ in range(3):
        batch = make_batch(
            member,
            status="completed",
            total=50_000,
            completed=49_990,
            failed=10,
            input_tokens=123_456_789,
            output_tokens=9_876_543,
        )
        LedgerEntry.objects.create(
            batch_id=batch.public_id,
            organization=member,
            batch_status="completed",
            model_name=MODEL,
            priority="standard",
            created_at=timezone.now(),
            input_tokens=123_456_789,
            cached_tokens=1_234_567,
            output_tokens=9_876_543,
            reasoning_tokens=0,
            price_input="0.2",
            price_cached_input="0.05",
            price_output="0.8",
            price_multiplier="0.5",
            input_cost_nanos=12_345_678_901,
            cached_input_cost_nanos=30_864_175,
            output_cost_nanos=3_950_617_200,
            total_cost_nanos=16_327_160_276,
        )
    url = processes.web("uvicorn")
    sign_in_as(page, url, STAFF)
    assert page.viewport_size["width"] == 1280

    page.goto(url + "/files")
    # Each date and size on one line (a text's line boxes, not its cell's height: the row is as tall as its
    # tallest cell), and nothing past the window's right edge.
    lines = page.evaluate("""() => [...document.querySelectorAll('table.files td.when, table.files td.num')].map(c => {
        const range = document.createRange(); range.selectNodeContents(c); return range.getClientRects().length; })""")
    assert set(lines) == {1}, lines
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 1280
    shots(page, "01-files")

    for name, path in (
        ("02-admin-batches", "/admin/batches/batch/"),
        ("03-admin-ledger", "/admin/billing/ledgerentry/"),
    ):
        page.goto(url + path)
        assert page.locator("#result_list tbody tr").count() == 3
        fit = page.evaluate("""() => ({page: document.documentElement.scrollWidth,
                                        table: document.querySelector('#result_list').scrollWidth,
                                        room: document.querySelector('#changelist .results').clientWidth})""")
        shots(page, name)
        assert fit["page"] <= 1280 and fit["table"] <= fit["room"], (path, fit)  # no column scrolled out of sight
