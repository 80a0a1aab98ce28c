"""Helpers with no domain in them: environment readers (env), public ids (ids), the asyncio runner
(aio), the guarded way out to a user's URL (outbound), the one redaction, JSON logs. The bottom layer:
imports no other openrelay package."""
