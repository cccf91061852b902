"""OpenAI's Responses wire (stateless): parse.py reads the bodies, render.py writes the response
object and its events. Errors have OpenAI's shape (openai/render.py)."""
