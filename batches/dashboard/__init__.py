"""The browser dashboard: the batches and files pages and the operator page (views, urls), their
websockets (consumers, routing) and the live batch events the engine and services send them (events)."""
