// The official openai Node SDK's documented batch flow against OpenRelay:
// upload with fs.createReadStream (streamed as a chunked multipart body),
// create a batch, poll it to the end, download the output, list.
//
// node batch_flow.mjs INPUT.jsonl  (OPENAI_BASE_URL, OPENAI_API_KEY from the environment)
// Prints one JSON object with what it saw; exits 1 with the error on stderr.
import fs from "node:fs";
import OpenAI from "openai";

const TERMINAL = ["completed", "failed", "expired", "cancelled"];
const DEADLINE_MS = 60_000;
const POLL_MS = 100;

// What the SDK handed fetch for each request: a stream body is sent chunked (no Content-Length).
const sent = [];
const recordingFetch = (url, init = {}) => {
  sent.push({ method: init.method, url: String(url), streamed: init.body instanceof ReadableStream });
  return fetch(url, init);
};
const client = new OpenAI({ maxRetries: 0, fetch: recordingFetch });
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main(input) {
  const file = await client.files.create({ file: fs.createReadStream(input), purpose: "batch" });
  let batch = await client.batches.create({
    input_file_id: file.id,
    endpoint: "/v1/chat/completions",
    completion_window: "24h",
    metadata: { client: "node" },
  });
  const created = batch;
  const deadline = Date.now() + DEADLINE_MS;
  while (!TERMINAL.includes(batch.status)) {
    if (Date.now() > deadline) throw new Error(`batch ${batch.id} still ${batch.status} after ${DEADLINE_MS} ms`);
    await pause(POLL_MS);
    batch = await client.batches.retrieve(batch.id);
  }
  const output = batch.output_file_id ? await (await client.files.content(batch.output_file_id)).text() : null;
  const batches = [];
  for await (const listed of client.batches.list({ limit: 2 })) batches.push(listed.id);
  const files = [];
  for await (const listed of client.files.list({ purpose: "batch" })) files.push(listed.id);
  return { file, created, batch, output, batches, files, sent };
}

main(process.argv[2]).then(
  (result) => process.stdout.write(JSON.stringify(result)),
  (error) => {
    process.stderr.write(`${error.status ?? ""} ${error.message}\n`);
    process.exit(1);
  },
);
