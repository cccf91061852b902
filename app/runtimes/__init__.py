"""Runtimes: in-process model engines behind the small protocol in ``app.core.types``."""
