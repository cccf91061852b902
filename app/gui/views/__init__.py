"""The main window's pages, one folder per page that has parts of its own (chat, library,
providers, server, settings); a page that is one module (connect, discover, downloads) sits here,
with the small widgets the pages share (common)."""
