"""The web process around Django: request ids, host routing and the error envelope on every `/v1/`
answer (middleware, hosts), the bounded ASGI handler, uvicorn's header cap (webserver) and the
`/healthz` and `/readyz` probes."""
