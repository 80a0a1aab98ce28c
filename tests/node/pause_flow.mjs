// The official openai Node SDK with OpenRelay's guardrails: create with a spend cap (an extra body
// field), pause and resume (client.post), retrieve and list a paused batch, cancel it, and a
// refused pause.
//
// node pause_flow.mjs INPUT_FILE_ID  (OPENAI_BASE_URL, OPENAI_API_KEY from the environment)
// Prints one JSON object with what it saw; exits 1 with the error on stderr.
import OpenAI from "openai";

const client = new OpenAI({ maxRetries: 0 });

async function main(inputFileId) {
  const created = await client.batches.create({
    input_file_id: inputFileId,
    endpoint: "/v1/chat/completions",
    completion_window: "24h",
    openrelay: { max_cost: "5" },
  });
  const paused = await client.post(`/batches/${created.id}/pause`);
  const retrieved = await client.batches.retrieve(created.id);
  const listed = [];
  for await (const batch of client.batches.list()) listed.push(batch.id);
  const resumed = await client.post(`/batches/${created.id}/resume`, { body: { max_cost: 9 } });
  await client.post(`/batches/${created.id}/pause`);
  const cancelled = await client.batches.cancel(created.id);
  let refused = null;
  try {
    await client.post(`/batches/${created.id}/pause`);
  } catch (error) {
    refused = { status: error.status, code: error.code };
  }
  return { created, paused, retrieved, listed, resumed, cancelled, refused };
}

main(process.argv[2]).then(
  (seen) => console.log(JSON.stringify(seen)),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
