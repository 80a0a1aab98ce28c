"""Row 22 (tests/perf/bench_llamacpp.py): skipped, not failed, where no llama-server is built; it reads
llama.cpp's own line from its /metrics page."""

from types import SimpleNamespace

from tests.perf import bench_engine
from tests.perf.bench_llamacpp import LlamaRuns, built, read_line

# The lines of a llama-server /metrics page (tools/server/server-task.cpp) the row reads, among the others.
PAGE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


def test_without_a_built_server_the_row_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENRELAY_REAL_CACHE", str(tmp_path))
    reports = []
    bench = SimpleNamespace(rows={}, report=reports.append, stack=None)

    LlamaRuns(bench).run()

    row = bench.rows["llamacpp_flow"]
    assert row.passed is None
    assert "llamacpp_build.py" in row.result
    assert "| 22 | flow control against a real llama.cpp server |" in bench_engine.markdown(
        [row], {"quick": False, "database": "sqlite", "broker": "orm", "seconds": 1, "machine": "here"}
    )
    assert bench_engine._verdict(row) == "SKIP"
    assert reports and "skipped" in reports[0]


def test_a_built_server_without_its_model_tools_counts_as_not_built(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_bytes(b"")
    assert built(tmp_path) is None  # no tool venv to make the GGUF with
    (tmp_path / "tiny.gguf").write_bytes(b"")
    assert built(tmp_path) == (tmp_path / "bin" / "llama-server", tmp_path / "tiny.gguf")


def test_the_line_comes_from_the_servers_own_figures():
    assert read_line(PAGE) == (3.0, 4.0)
    assert read_line("llamacpp:prompt_tokens_total 12\n") == (None, None)
