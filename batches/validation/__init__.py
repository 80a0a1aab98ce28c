"""Create-time validation: the create request's parameters and every input record, one job a module.

Two kinds of failure, two answers:
- a bad request (endpoint, metadata, too many records, ...) refuses the
  create with a 400 (`ApiError`, or `FileRejected` for the input file);
- a bad record rejects only that record (`RecordRejected`), listed in the
  batch's `errors` with its 1-based line; the rest run.

`params` checks the create request's parameters; `jsonl` scans the input
file line by line and hands each line to `records`, which checks one record
and calls `extensions` for its `openrelay.tool_config` / `openrelay.workflow`.
The imports run that way only (jsonl -> records -> extensions; params stands
alone). `normalize_tool_config` and `normalize_workflow` are also called by the
engine on the body it reads back, so what runs is the clamped value.
"""
