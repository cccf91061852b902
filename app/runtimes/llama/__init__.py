"""The llama.cpp runtime, in process through llama-cpp-python: the runtime and its models
(runtime.py), the engine a model's worker drives (engine.py, with its slots, sampling,
admission, speculative decoding, pooled outputs and vision), llama.cpp's process-wide side
(backend.py, system.py), the grammars it enforces (grammar.py) and the child process that
checks an unknown file before Hearth loads it (probe.py, probe_child.py)."""
