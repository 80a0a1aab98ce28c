"""Anthropic's Message Batches API (`/v1/messages/batches`), a second dialect of the same batches.

A Message Batch is a batch whose endpoint is `/v1/messages`: its `requests[]` are stored as
the batch's input file, its records run on the same engine, are billed, shown in the dashboard
and reported by webhooks like any other. Its id `msgbatch_<x>` is the batch `batch_<x>` of the
OpenAI dialect. This package only speaks the dialect: the create body (params.py), the
MessageBatch object (presenters.py), the result lines (results.py), delete (services.py) and
the routes (views.py, urls.py). Errors are the house's ApiError, put in Anthropic's envelope by
openrelay.web.middleware.DialectErrorMiddleware.
"""
