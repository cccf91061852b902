"""The Settings page (page.py) and its sections: the server key, start at login (shared with the
welcome), the window, MCP servers and the runtime report."""
