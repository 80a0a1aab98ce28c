"""The answer cache (openrelay.reuse "cache"): an organization's later batch answers an identical
request from an earlier batch's stored answer, without a model call; never across organizations,
from a failed answer, past the TTL, or after the source's files were deleted."""

from datetime import timedelta

from batches.engine.runner import run_batch
from batches.models import Batch, Record
from files import services as files
from openrelay.core.models import Deployment
from tests.helpers import chat, read_lines
from tests.reuse_tests.conftest import create

BODIES = [chat(f"q{i % 3}", temperature=0) for i in range(6)]  # 3 distinct requests, each twice


def run(persona, bodies=BODIES, reuse="cache"):
    batch = Batch.objects.get(public_id=create(persona, bodies, reuse=reuse)["id"])
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert batch.status == "completed"
    return batch


def calls(sim):
    return len(sim.requests("/v1/chat/completions"))


def test_a_later_identical_batch_makes_no_call(alice, model, fresh_sim):
    first = run(alice)
    assert calls(fresh_sim) == 3
    second = run(alice)
    assert calls(fresh_sim) == 3  # none more
    out = {line["custom_id"]: line for line in read_lines(second.output_file)}
    before = {line["custom_id"]: line for line in read_lines(first.output_file)}
    assert len(out) == 6
    for custom_id, line in out.items():
        assert line["response"]["body"] == before[custom_id]["response"]["body"]
        source = line["openrelay"]["reused_from"]
        assert source["batch_id"] == first.public_id and source["custom_id"] in ("req-1", "req-2", "req-3")
    assert (second.cache_hit_count, second.reused_count, second.input_tokens, second.output_tokens) == (6, 6, 0, 0)
    assert second.reused_input_tokens == 6 * (first.input_tokens // 3)


def test_auto_batches_neither_fill_nor_read_the_cache(alice, model, fresh_sim):
    run(alice, reuse="auto")
    run(alice)  # "cache" finds nothing an "auto" batch stored
    run(alice, reuse="auto")  # and "auto" reads nothing a "cache" batch stored
    assert calls(fresh_sim) == 9


def test_never_across_organizations(alice, bob, model, fresh_sim):
    run(alice)
    other = run(bob)
    assert calls(fresh_sim) == 6 and other.cache_hit_count == 0


def test_never_from_a_failed_answer(alice, model, fresh_sim):
    failing = [chat("boom [[status:400]]", temperature=0)]
    first = run(alice, failing)
    assert first.failed_count == 1
    run(alice, failing)
    assert calls(fresh_sim) == 2


def test_never_after_the_source_files_were_deleted(alice, model, fresh_sim):
    first = run(alice)
    files.delete_file(first.input_file)
    again = run(alice)
    assert calls(fresh_sim) == 6 and again.cache_hit_count == 0


def test_never_past_the_ttl(alice, model, fresh_sim, settings):
    first = run(alice)
    Record.objects.filter(batch=first).update(finished_at=first.completed_at - timedelta(hours=2))
    alice.org.reuse_cache_ttl_s = 3600  # the organization's own TTL wins over the setting
    alice.org.save()
    settings.OPENRELAY_REUSE_CACHE_TTL_S = 10 * 3600
    run(alice)
    assert calls(fresh_sim) == 6


def test_never_when_the_deployment_changed_its_upstream_model(alice, model, fresh_sim):
    run(alice)
    Deployment.objects.filter(model=model).update(upstream_model="another-upstream")
    run(alice)
    assert calls(fresh_sim) == 6
