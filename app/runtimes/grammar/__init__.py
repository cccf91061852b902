"""Output constraints as grammars: GBNF measured before llama.cpp parses it (gbnf.py, with its
parser and stack count), llguidance matchers for MLX (guidance.py), and the threads that
compile them off every model's worker (compile_pool.py)."""
