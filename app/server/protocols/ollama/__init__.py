"""Ollama's wire: parse.py reads the bodies, render.py writes the answers, the NDJSON lines and
the error shape, models.py the model listings."""
