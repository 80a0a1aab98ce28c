"""The bench's output-contract rows (16, 17: issue 38), opt-in: `manage.py bench --only contracts`.

16: every record's first answer is made invalid by the simulator (wrong type,
missing field, cut JSON, prose around it, in turn); every tenth record's
stays invalid. All the others must be valid after one re-ask, and the error
file must hold exactly the records made to stay invalid.

17: the same plain records with a contract on each (their response_format's
schema, which the answers pass) and without (`openrelay.output_contract:
false` at create turns contracts off): throughput, taking turns, best of each.
"""

import time

import orjson

ENDPOINT = "/v1/chat/completions"
MODEL = "bench/zero"  # bench_engine.MODEL_ZERO: the 0 ms model
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
KINDS = ("wrong_type", "missing_field", "truncated", "not_json")
STAY_INVALID_EVERY = 10
ROUNDS = 5


def write_contract_input(path, records, model, *, spoil=True):
    with open(path, "wb") as out:
        for i in range(records):
            content = f"Person {i}"
            if spoil:
                times = "x9" if i % STAY_INVALID_EVERY == 0 else ""
                content += f" [[invalid_output:{KINDS[i % len(KINDS)]}{times}]]"
            body = {
                "model": model,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": content}],
                "response_format": FORMAT,
            }
            out.write(orjson.dumps({"custom_id": f"req-{i:06d}", "method": "POST", "url": ENDPOINT, "body": body}))
            out.write(b"\n")


class ContractRuns:
    def __init__(self, bench):
        self.bench = bench

    def _create(self, file_id, contract=None):
        extra = {"openrelay": {"output_contract": contract}} if contract is not None else {}
        sent = time.time()
        response = self.bench.api.client.post(
            "/batches", json={"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": "24h", **extra}
        )
        response.raise_for_status()
        return response.json(), sent

    def reasks(self):
        from tests.perf.bench_engine import TARGETS, Row

        bench, records = self.bench, max(40, self.bench.scale.plain // 10)
        path = bench.tmp / "contracts-reask.jsonl"
        write_contract_input(path, records, MODEL)
        file_id, _ = bench.api.upload(path)
        bench.shared_cluster()
        batch, sent = self._create(file_id)
        row = bench.wait_done(batch["id"], bench._deadline(records, 100))
        db = bench.stack.db
        invalid = {
            int(custom_id.removeprefix("req-"))
            for (custom_id,) in db.query(
                "SELECT custom_id FROM batches_record WHERE batch_id = %s AND error_code = 'invalid_output'",
                (row["pk"],),
            )
        }
        once = db.query(
            "SELECT COUNT(*) FROM batches_record WHERE batch_id = %s AND status = 'succeeded' AND reasks = 1",
            (row["pk"],),
        )[0][0]
        meant = {i for i in range(records) if i % STAY_INVALID_EVERY == 0}
        valid_share = once / (records - len(meant))
        took = row["completed_at"] - sent
        bench.rows["contracts_reask"] = Row(
            "contracts_reask",
            16,
            f"output contracts: {records:,} records, every first answer invalid, 1 in {STAY_INVALID_EVERY} "
            "made to stay so",
            f"{valid_share:.0%} valid after 1 re-ask; error file = the {len(meant)} made invalid: {invalid == meant}",
            TARGETS["contracts_reask"],
            valid_share == 1.0 and invalid == meant and row["completed"] == records - len(meant),
            f"{took:.1f} s create -> completed; kinds {', '.join(KINDS)} in turn; default max_reasks 2",
            {"records": records, "valid_after_one": once, "invalid": len(invalid), "seconds": took},
        )
        bench.report(f"16: {once}/{records - len(meant)} valid after one re-ask; {len(invalid)} invalid_output")

    def throughput(self):
        from tests.perf.bench_engine import TARGETS, Row

        bench, records = self.bench, self.bench.scale.plain
        path = bench.tmp / "contracts-pass.jsonl"
        write_contract_input(path, records, MODEL, spoil=False)
        file_id, _ = bench.api.upload(path)
        bench.shared_cluster()
        with_runs, without_runs = [], []
        for _ in range(ROUNDS):
            without_runs.append(self._rate(file_id, False, records))
            with_runs.append(self._rate(file_id, None, records))
        best_with, best_without = max(with_runs), max(without_runs)
        ratio = best_with / best_without
        bench.rows["contracts_throughput"] = Row(
            "contracts_throughput",
            17,
            f"output contracts: {records:,} plain records that pass, with a contract on each vs none",
            f"{ratio:.2f}x",
            TARGETS["contracts_throughput"],
            ratio >= 0.95,
            f"with {best_with:.0f}/s (best of {', '.join(f'{r:.0f}' for r in with_runs)}) vs without "
            f"{best_without:.0f}/s (best of {', '.join(f'{r:.0f}' for r in without_runs)}), taking turns",
            {"with": with_runs, "without": without_runs, "ratio": ratio},
        )
        bench.report(f"17: contracts {ratio:.2f}x ({best_with:.0f}/s vs {best_without:.0f}/s)")

    def _rate(self, file_id, contract, records):
        batch, sent = self._create(file_id, contract)
        row = self.bench.wait_done(batch["id"], self.bench._deadline(records, 200))
        assert row["completed"] == records, row
        return records / (row["completed_at"] - sent)
