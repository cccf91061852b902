"""The embedded aiohttp server over the core: every wire API (OpenAI, Responses, Anthropic,
Ollama) and Hearth's native API on one port.

- runner.py: ServerController, which starts and stops the server on the service loop;
  app.py: create_app(), the application and its typed state (state.py).
- protocols/: one pure translator per wire (parse and render halves, no aiohttp).
- routes/: every route table, thin handlers; streaming.py: the one path every generation's
  answer goes through.
- middleware.py: the edge of every request (allow-lists, keys via keyguard.py, time limit,
  errors in the owning protocol's shape); records.py and telemetry.py: what it records.
- edge/: connection deadlines and caps, TLS, request bodies, images in requests.
"""
