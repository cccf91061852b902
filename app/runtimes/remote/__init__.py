"""Remote engines as providers: the HTTP client (client.py), the OpenAI wire it speaks
(codec.py) and what each kind of engine says about itself (kinds.py)."""
