"""Anthropic's Messages wire: parse.py reads the bodies, render.py writes the answers, the
stream's events and the error shape."""
