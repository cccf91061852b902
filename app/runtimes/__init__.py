"""Runtimes: the model engines behind the small protocol in ``app.core.types``. In process:
llama.cpp (llama/) and MLX (mlx/), each model owned by one worker thread (worker.py, shared by
both) whose decode threads can follow the machine's load (threads.py, engine-agnostic). Output
constraints compiled into grammars (grammar/); remote engines over HTTP as providers (remote/)."""
