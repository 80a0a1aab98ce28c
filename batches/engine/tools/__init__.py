"""Tool executors a tool loop calls: the interface (executors), the user's HTTP executor and MCP server."""
