"""OpenAI's wire: chat completions, legacy completions and embeddings (parse.py reads the bodies,
with the fields in fields.py; render.py writes the answers and the error shape) and /v1/rerank
(rerank.py). The Responses API, on OpenAI's error shape too, is in ../responses/."""
