"""Simulated OpenAI-compatible model server.

The embedded default upstream on a fresh machine, the model server of every
test, and the peer of the load benchmarks. It speaks just enough of the OpenAI
API to be indistinguishable from a real deployment for a batch gateway, and
its answers are deterministic: the same request body always gets the same
answer, apart from `id` and `created`.

Endpoints
---------
- `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`,
  `POST /v1/responses`, `POST /v1/moderations`
- `POST /v1/messages`: Anthropic's Messages API (messages.py), as vLLM,
  llama.cpp and Ollama serve it: the chat rules in Anthropic's shapes
  (content blocks, `tool_use` / `tool_result`, `stop_reason`, usage with
  `cache_read_input_tokens` apart from `input_tokens`)
- `GET /v1/models`
- `GET /_sim/requests`: the recorded model calls, oldest first, each
  `{"path", "headers", "body"}`; secret headers (`authorization`, `api-key`,
  `x-api-key`, `proxy-authorization`, `cookie`) are never recorded. Only the
  last `record_limit` (10,000) calls are kept; `record=False` turns it off.
- `POST /_sim/reset`: forget the recorded calls and the per-body counters
  (and zero the capacity model's figures, empty its prefix cache).
- `GET /_sim/stats`: the capacity model's figures (see "Capacity model").
- `GET /_sim/calls`: `{"total", "by_peer", "in_flight", "in_flight_by_peer", "max_in_flight"}`, the model
  calls in all and by the client's address, those in the server now and the most at
  once since the last reset (tests of many hosts count a cut host's calls by it).
- `GET /metrics`: only with `metrics` set (404 otherwise, as before).
- `POST /tokenize` and `POST /v1/chat/completions/input_tokens`: only with
  `tokenizer` set. "vllm": vLLM's /tokenize (`messages` or `prompt` ->
  `{"count", "max_model_len", "tokens"}`); "llamacpp": llama.cpp's
  input_tokens route (a chat request -> `{"input_tokens"}`) and its raw-text
  /tokenize (`content` -> `{"tokens"}`, no count). Both count by the token
  rule below, so a count equals the call's `prompt_tokens`; both are recorded.

Token rule
----------
- A text costs `max(1, ceil(len(text) / 4))` tokens (about 4 characters a
  token). A prompt given as a token array costs one token per element.
- Chat `prompt_tokens` count the text of every message (string content or the
  `text` of content parts, plus the name and arguments of earlier tool calls).
- `cached_tokens` = `prompt_tokens // 2` rounded down to a multiple of 64
  (so prompts under 128 tokens have none) without the capacity model; with
  it, what its prefix cache held. `reasoning_tokens` is always 0.
- `completion_tokens` count the answer text (for tool calls: each function's
  name plus its arguments). `max_tokens` / `max_completion_tokens` cap them;
  a capped answer is cut to `4 * cap` characters and ends with
  `finish_reason: "length"`. Tool-call turns are never capped.
- `[[tokens:N]]` in the text (for completions, in that prompt) makes the
  answer exactly N completion tokens: the echo padded with " sim" (one token
  each) or cut to `4 * N` characters; the caps above still apply. Tool-call
  turns ignore it.

Answers
-------
- chat: `"Simulated answer to: <first 60 chars of the last user message>"`
  (directives removed from the echo), `n` choices if `n` is given.
- completions: `"Simulated completion of: <first 60 chars of the prompt>"`,
  one choice per prompt.
- responses: a `response` object whose one `message` output item says
  `"Simulated response to: <first 60 chars of the last user input>"`, with
  usage in the Responses shape (`input_tokens`, `output_tokens`, details).
  `instructions` count as input; `max_output_tokens` caps the answer
  (`status: "incomplete"`, `incomplete_details.reason: "max_output_tokens"`);
  `reasoning.effort` adds a `reasoning` output item and `reasoning_tokens`
  (low 16, medium 64, high 256; a `reasoning` object without an effort is
  medium, `minimal` is 0), counted in `output_tokens`.
- moderations: one result an input, never flagged, every category score
  below 0.01 (derived from a hash of the input); no `usage`, as OpenAI's.
- embeddings: unit-length float vectors derived from a hash of each input
  (string or list of strings, or token arrays), 16 dimensions unless
  `dimensions` says otherwise; `encoding_format: "base64"` is honoured. An
  answer of a million numbers or more (2,048 x 3,072: ~130 MB of JSON) is
  built in a child process, so the server answers other calls meanwhile.

Tool calls
----------
When a chat request carries a non-empty `tools` list (and `tool_choice` is not
`"none"`), the simulator asks for tools while the number of tool rounds
already in the conversation (assistant messages with `tool_calls`) is below
the wanted number of rounds. It then answers with `finish_reason:
"tool_calls"` and tool calls with ids `call_<round>_<i>` (both from 0), type
`function`, and `arguments` as a JSON string. After that (or when a `tool`
message is present and no call is wanted) it answers
`"Final answer using: <content of the last role=tool message>"`.

- The first tool is called by default; `tool_choice: {"type": "function",
  "function": {"name": X}}` forces tool X.
- Arguments are built from the tool's `parameters.properties`: string ->
  `"sim"`, integer -> 1, number -> 1.5, boolean -> true, a property with an
  `enum` -> its first value, anything else -> null.

Directives in user messages (tool behaviour):
- `[[tool_rounds:N]]`: want N tool rounds (default 1; N=99 never finishes).
- `[[tool_calls:K]]`: K parallel calls per turn, cycling over the tools.
- `[[tool_args:{...json...}]]`: use this object as the arguments.

Faults
------
Directives in the text of any message (for completions the prompt, for
embeddings the input), so one batch can mix outcomes deterministically. A
directive in a `tool` message affects the next model call of the loop.
- `[[status:NNN]]`: answer HTTP NNN with an OpenAI error envelope
  `{"error": {"message", "type", "param", "code"}}`; a 404 names the model
  asked for, as vLLM's does ("The model `X` does not exist.").
- `[[status:NNNxK]]`: answer NNN the first K times this exact body is seen,
  then answer normally ("failed server, the rerun succeeds").
- `[[drop]]` / `[[dropxK]]`: close the connection without an answer (always /
  the first K times this exact body is seen).
- `[[hang]]`: never answer (until the client gives up or the server stops).
- `[[latency:MS]]`: wait MS milliseconds before answering.
Every 429 carries `Retry-After: <retry_after_s or 1>` (seconds, may be
fractional) and `retry-after-ms`.

Server-wide knobs (`SimulatorConfig`, or the command-line flags):
`latency_ms` (added to every answer), `error_rates` ({status: probability}),
`drop_rate`, `hang_rate`, `retry_after_s`, `seed`, `fail_all_status` (every
request gets that status: a dead deployment), `drop_all` (every connection is
dropped), `api_key` (when set, a request without `Authorization: Bearer <it>`
gets 401, as vLLM's `--api-key` answers), `record`, `record_limit`, `models` (listed by `/v1/models`),
and the capacity model's (below).
The random draw for a request is seeded by (seed, body hash, how many times
that body was seen), so a run is reproducible even when requests arrive
concurrently in a different order, and a retried body gets a fresh draw.

Capacity model
--------------
Off while `slots` is 0: then every request is answered as soon as it arrives
(after `latency_ms`), however many there are. With `slots` N > 0 the server
has one GPU's shape (vLLM's `max_num_seqs`, llama.cpp's `--parallel`):
- At most N requests hold a slot at once; the others wait in a FIFO queue.
  When `queue_limit` requests are already waiting, a new one gets 503 at
  once ("The server is overloaded: N requests are waiting.", the error
  envelope, `Retry-After: <retry_after_s or 1>`); `queue_limit` None queues
  without limit, as llama.cpp defers.
- A request holding a slot prefills, `prefill_ms_per_token` for each
  uncached prompt token, then decodes, for each completion token it produces
  `decode_ms_per_token * (1 + decode_contention * (busy - 1) / N)`, where
  busy is the slots held when its decode starts (itself included). Queueing
  and prefill count in the latency a client sees. Throughput still grows
  with busy slots up to N (continuous batching) while `decode_contention`
  is below N, and past N requests only queue. `capacity_per_second()` gives
  the most requests a second of a given shape. `latency_ms` and
  `[[latency:MS]]` wait before the queue: they add latency, take no capacity.
- `prefix_cache_tokens` > 0 adds a prefix cache of that many tokens, like
  vLLM's automatic prefix caching. The cache reads a chat as each message's
  role, a newline, its text, a newline; a completion as its prompt; a
  response as "instructions", a newline, its instructions, a newline, then
  its input items as chat messages (embeddings and moderations skip it).
  That text is cut into whole blocks of 64 characters (16 tokens), at most
  `prompt_tokens // 16` of them, each keyed by a hash chained over all the
  blocks before it. A request's `cached_tokens` is 16 times its leading
  blocks found in the cache when it takes its slot; only the rest is
  prefilled. When its prefill ends its blocks go in (or are refreshed) tail
  first, and past capacity the least recently used blocks go out, so a
  shared head outlives the tails behind it. Without a prefix cache nothing
  is cached. Chat and completions report it in
  `usage.prompt_tokens_details.cached_tokens`, responses in
  `usage.input_tokens_details.cached_tokens`.
- `[[status:...]]`, `[[drop]]`, `[[hang]]` and the random faults, a 400 or
  a 401 are answered without a slot. A request whose caller goes away
  leaves the queue or frees its slot; shutdown ends them all.
- A request with several prompts or `n` choices is one request: it holds one
  slot and decodes all its completion tokens.
- `GET /_sim/stats` (and `SimulatorThread.stats()`): `completed`,
  `rejected` (503s of the queue limit), `running`, `waiting`, `max_running`,
  `max_waiting`, `busy_slot_seconds` (busy slots integrated over time),
  `prompt_tokens`, `cached_tokens`, `completion_tokens` of completed
  requests, `prefix_cache_queries` (prompt tokens looked up),
  `prefix_cache_used_tokens`, `slots`, `queue_limit`; the figures stay 0
  while `slots` is 0.
- `metrics="vllm"` serves `GET /metrics` with vLLM's names and types: gauges
  `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc` and its older name `vllm:gpu_cache_usage_perc`
  (busy slots / N: the simulator keeps no KV blocks), counters
  `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` (tokens),
  labelled `model_name` (the first of `models`) and `engine="0"`.
  `metrics="llamacpp"` serves llama-server's: counters
  `llamacpp:prompt_tokens_total` (uncached tokens, what it processed),
  `llamacpp:tokens_predicted_total`, gauges `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, `llamacpp:kv_cache_usage_ratio`, without
  labels and behind `api_key` (vLLM's key guards /v1 only).

Usage
-----
    python -m openrelay.simulator --port 8001 --error-rate 503=0.1
    python manage.py simulate_model --port 8001 --latency-ms 50
    python -m openrelay.simulator --slots 16 --decode-ms-per-token 20 \
        --prefill-ms-per-token 0.2 --prefix-cache-tokens 200000 --metrics vllm

    from openrelay.simulator.config import SimulatorConfig
    from openrelay.simulator.server import run_in_thread

    with run_in_thread(SimulatorConfig()) as sim:
        sim.base_url   # "http://127.0.0.1:PORT/v1"
        sim.requests() # recorded calls
        sim.stats()    # the capacity model's figures
        sim.reset()

Modules
-------
Each imports only modules listed before it:
- `config`: `SimulatorConfig`, the server-wide knobs.
- `directives`: the `[[...]]` directives of a request's text.
- `bodies`: the messages, prompts and inputs of a request body, and their text.
- `answers`: each endpoint's answer, the token rule, `BadRequest`, `error_envelope`.
- `faults`: a request's fate (answer, fail, drop, hang) and its seeded draw.
- `capacity`: the capacity model, its prefix cache, `capacity_per_second`.
- `metrics`: `GET /metrics` in vLLM's or llama.cpp's names.
- `state`: the recorded calls and per-body counters.
- `server`: `ModelServer`, `build_app`, `AppThread` / `SimulatorThread` /
  `run_in_thread`, `serve`.
- `cli`: the command-line flags and `main` (`python -m openrelay.simulator`).

This package must not import Django: it runs standalone too.
"""
