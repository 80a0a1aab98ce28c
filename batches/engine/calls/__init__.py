"""Calls to model servers: the one caller (time limit, retries, failover, usage), the HTTP transport,
usage read from each answer shape, and how calls are spread: deployment health, adaptive concurrency
(flow), prefix-aware dispatch and the calls-a-minute counts."""
