"""The threads that convert JSON schemas into grammars and compile them, apart from every
model's worker: a model's worker thread decodes every running stream of that model, so work
done there stalls them all (three schemas converting on it froze a running stream for 28.7 s).
Their stack is :data:`app.runtimes.worker.THREAD_STACK_BYTES`: llama.cpp's grammar parser
recurses, and the grammar bounds are chosen for that stack.
Tested by tests/runtimes/grammar/test_limits.py.
"""

from __future__ import annotations

from app.core.util.job_pool import JobPool
from app.runtimes.worker import start_thread

MAX_THREADS = 2  # the schema bounds keep one job well under a second; two let a second wait less

# the process's one pool: the constraints of every model's requests share its threads
COMPILE_POOL = JobPool(threads=MAX_THREADS, name="hearth-compile", start=start_thread)
