"""The Server page's small charts: decode speed, prompt-cache hits, and the painting they share."""
