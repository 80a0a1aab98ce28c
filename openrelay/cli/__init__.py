"""`orl`: the OpenRelay Batch command-line client.

It speaks only the public HTTP API (httpx), never Django: it must run on a
machine with just this package installed and no settings. Tables go to
stdout, errors and progress to stderr, so `--json` output and `-o -`
downloads stay clean for pipes.

Exit codes: 0 success, 1 API error or unreachable server, 2 usage error
(bad option, no API key, missing input file), 3 a waited-for batch ended
failed, expired or cancelled.
"""
