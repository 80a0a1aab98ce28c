"""What a record runs: one model call (plain), a tool-calling loop (toolloop) or a workflow whose
callback picks the next requests; dispatch picks the loop, checkpoints keep a multi-step record's
state under its lease so a resumed run continues."""
