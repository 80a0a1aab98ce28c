"""`python manage.py bench`: the gateway against the limits of issue 12, in one run.

The measuring lives in tests/perf/bench_engine.py: run it from a checkout, with the
`bench` extra installed (psutil); this command parses the options, runs it and prints
the table, or says which of the two is missing.
"""

import sys

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Benchmark the whole gateway (uvicorn web, qcluster workers with their engines, simulated model servers) in "
        "throwaway state and print every measurement with its target. SQLite + ORM broker by default; --database-url and "
        "--redis-url run it on PostgreSQL + Redis (a database is created and dropped on that server)."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--quick",
            action="store_true",
            help="500 records, tiny files, small runs of the rest: proves it runs (~1.5 min)",
        )
        parser.add_argument(
            "--records",
            type=int,
            default=None,
            help="records of the large batch (default 50,000; the other runs scale with it)",
        )
        parser.add_argument(
            "--database-url",
            default=None,
            help="a PostgreSQL server to create the benchmark's database on, e.g. "
            "postgres://postgres@127.0.0.1:5432/postgres (default: a temp SQLite file)",
        )
        parser.add_argument(
            "--redis-url",
            default=None,
            help="a Redis server for the broker and channel layer; an empty database index on it "
            "is used and flushed (default: the ORM broker)",
        )
        parser.add_argument(
            "--web-server",
            choices=["daphne", "uvicorn"],
            default="uvicorn",
            help="the ASGI server of the web process (default uvicorn, as `manage.py up` and production run it)",
        )
        parser.add_argument(
            "--only",
            nargs="+",
            default=None,
            metavar="PART",
            help="run only these parts: big (measurements 1, 2, 6, 8), e2e (3), first_call (4), "
            "latency (5), scale (7), fairness (9), recovery (10), many (11), flow (12, 13: adaptive "
            "concurrency), prefix (14: prefix-aware dispatch), "
            "reuse (19: identical records run once); opt-in: big_answers (15), contracts (16, 17: output "
            "contracts), refusals (18: flow control's 503s at the defaults, before beside after), takeover (20: "
            "kill -9 of one of two clusters, the worst re-send of its calls in flight), llamacpp (22: flow control "
            "against a real llama.cpp server; skipped until tests/real/llamacpp_build.py has built one)",
        )
        parser.add_argument(
            "--refusals",
            nargs="+",
            default=(),
            metavar="TERM",
            help="with --only refusals: only row 18's runs these terms name, e.g. q0 2c (the server without a "
            "queue, two clusters); a server q0, q16 or q64, a path latency or vllm, 1c or 2c, before or after",
        )
        parser.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/performance.md)")
        parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows and facts as JSON")

    def handle(self, quick, records, database_url, redis_url, web_server, only, refusals, markdown, json, **options):
        try:
            from tests.perf import bench_engine
        except ImportError as exc:
            raise CommandError(_why_not(exc)) from exc
        unknown = set(only or ()) - set(bench_engine.PARTS)
        if unknown:
            raise CommandError(f"--only takes {', '.join(bench_engine.PARTS)}; not {', '.join(sorted(unknown))}.")
        try:
            bench_engine.refusal_runs(refusals)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if records is not None and records < 10:
            raise CommandError("--records must be at least 10.")
        if redis_url and not database_url:
            raise CommandError(
                "--redis-url needs --database-url: Redis goes with PostgreSQL (SQLite runs the ORM broker)."
            )

        def report(message):
            self.stderr.write(message)
            self.stderr.flush()

        rows, facts = bench_engine.run(
            quick=quick,
            records=records,
            database_url=database_url,
            redis_url=redis_url,
            report=report,
            web_server=web_server,
            only=only,
            refusals=refusals,
        )
        if markdown:
            self.stdout.write(bench_engine.markdown(rows, facts))
        else:
            from rich.console import Console

            tty = sys.stdout.isatty()
            bench_engine.render(
                rows,
                facts,
                Console(
                    file=self.stdout,
                    width=None if tty else 220,
                    force_terminal=tty,
                    color_system="auto" if tty else None,
                ),
            )
        if json:
            bench_engine.write_json(json, rows, facts)


def _why_not(exc):
    """Why the benchmarks can't run here: an installed package has no tests/, a checkout may lack their extra."""
    if exc.name in ("tests", "tests.perf"):
        return (
            "The benchmarks live in tests/perf, which the installed package does not ship: run manage.py bench "
            f"from a checkout of the repository ({exc})."
        )
    return f'The benchmarks need their own dependencies: pip install -e ".[bench]" in the checkout ({exc}).'
