"""Hearth's desktop app (PySide6). Talks to the core only through the service and the bridge."""
