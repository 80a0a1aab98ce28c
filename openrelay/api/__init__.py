"""API plumbing every app shares: the error envelope (errors, handlers), OpenAI's parameter wording
(params), list envelopes and pages (lists, pagination), JSON bodies (parsers), downloads (negotiation),
the OpenAPI schema and the rate limits. No models: imports openrelay.lib only."""
