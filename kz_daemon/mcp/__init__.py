"""The agent's loop as MCP tools: one tool set, served over stdio (kz mcp) and by the daemon at /mcp/."""
