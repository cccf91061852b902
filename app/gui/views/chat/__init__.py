"""The Chat page (page.py) and its parts: the transcript and its markdown, the answer in flight,
attachments and images, MCP tools, and the saved conversations (session.py, with the sidebar in
conversation_list.py)."""
