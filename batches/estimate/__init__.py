"""A quote for a batch before it runs: what would be accepted, its tokens, cost, time, and the window.

`quote.estimate` answers POST /v1/batches/estimate with create's own
validation (batches.services.check_input) and these parts, one job a module:
- `records`: what the quote keeps of each accepted record while the scan
  reads it (a local count, its output cap, whether it calls tools) and a
  bounded sample of bodies for the tokenizer;
- `tokens`: input tokens by the deployment's own tokenizer where it offers one
  (vLLM's /tokenize with chat messages, llama.cpp's
  /v1/chat/completions/input_tokens), else a stated approximation; its calls
  hold slots of the deployment's max_concurrency, shared by every web process;
- `counted`: what a tokenizer counted of a stored file's sample, kept per
  (file, deployment) so the same quote again asks the server nothing;
- `history`: the organization's past records on the model and endpoint
  (output tokens, tool rounds);
- `pace`: the engine's figures the time needs (measured throughput, the
  work queued ahead), read through a few narrow functions only.

A running batch's expected completion and its `batch.at_risk` event are not a
quote: they live in batches.risk, which the Batch object's presenter reads.
"""
