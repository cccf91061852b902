"""Saves conversations in a loop for the kill -9 test: ``python conversation_saver.py DB``.

Each save of conversation J at round R gives it ``1 + STEP * R`` messages and sets its first
message to ``round R``; it prints ``saving J R`` before the save and ``saved J R`` after, so the
test can kill it mid-save. Started again over the same file, it carries on from what it finds.
With ``--hold``, its first save stops inside the transaction (rows written, no commit) and
prints ``inside``: a kill there lands mid-save for certain.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from app.core.workspace.conversations import Conversation, ConversationStore
from app.errors import NotFound

CONVERSATIONS = 3
STEP = 7  # messages added per save
BODY = "x" * 16_000  # large rows: a save spans many pages of the write-ahead log


def hold_inside(store: ConversationStore) -> None:
    calls = 0

    def progress() -> int:
        nonlocal calls
        calls += 1
        if calls == 150:  # half-way through the save's ~300 instructions
            print("inside", flush=True)
            time.sleep(120)  # until killed
        return 0

    store._conn.set_progress_handler(progress, 1)


def main(db: Path, hold: bool) -> None:
    store = ConversationStore(db)
    convs = []
    for j in range(CONVERSATIONS):
        try:
            convs.append(store.load(f"conv{j}"))
        except NotFound:
            c = Conversation(id=f"conv{j}")
            c.add(None, "user", "round 0")
            convs.append(c)
    print("ready", flush=True)
    while True:
        for j, c in enumerate(convs):
            r = (len(c) - 1) // STEP + 1
            first = c.path()[0]
            c.update(first.id, content=f"round {r}")
            for k in range(STEP):
                c.add(c.selected, "assistant" if k % 2 else "user", f"{r}.{k} {BODY}")
            print(f"saving {j} {r}", flush=True)
            if hold:
                hold = False
                hold_inside(store)
            store.save(c)
            print(f"saved {j} {r}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--hold" in sys.argv[2:])
