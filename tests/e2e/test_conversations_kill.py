"""kill -9 during a save: every saved conversation stays readable and whole."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from app.core.workspace.conversations import ConversationStore
from tests.e2e.conversation_saver import CONVERSATIONS, STEP

SAVER = Path(__file__).with_name("conversation_saver.py")
ROOT = Path(__file__).resolve().parents[2]


def run_until(db: Path, saves: int, *, hold: bool = False) -> dict[int, set[int]]:
    """Start the saver; SIGKILL it at the first ``saving`` line after ``saves`` whole saves
    (the save may be anywhere: begun, half written, committed), or with ``hold`` when its first
    save is inside its transaction. Returns, per conversation, the rounds it began saving."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(SAVER), str(db), *(["--hold"] if hold else [])],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    begun: dict[int, set[int]] = {j: set() for j in range(CONVERSATIONS)}
    done = 0
    try:
        for line in proc.stdout:
            word, *rest = line.split()
            if word == "saving":
                j, r = map(int, rest)
                begun[j].add(r)
                if done >= saves and not hold:
                    proc.send_signal(signal.SIGKILL)  # mid-save: it is writing that round now
                    break
            elif word == "inside":
                proc.send_signal(signal.SIGKILL)
                break
            elif word == "saved":
                done += 1
    finally:
        proc.kill()
        proc.wait(60)
        # it runs ahead of this reader: a save it began before the kill landed is in the pipe
        # still (seen: round 5 of the next conversation written, its line not yet read)
        for line in proc.stdout:
            word, *rest = line.split()
            if word == "saving":
                j, r = map(int, rest)
                begun[j].add(r)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return begun


def check_whole(db: Path, rounds: dict[int, set[int]]) -> dict[int, int]:
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        raw.close()
    store = ConversationStore(db)
    got = {}
    try:
        for j in range(CONVERSATIONS):
            c = store.load(f"conv{j}")
            r = (len(c) - 1) // STEP
            # a count it was saved with, and the first message from that same save: no mix
            assert len(c) == 1 + STEP * r and r in rounds[j], (j, len(c), rounds[j])
            assert c.path()[0].content == f"round {r}"
            assert [m.content.split()[0] for m in c.path()[1:]] == [
                f"{i}.{k}" for i in range(1, r + 1) for k in range(STEP)
            ]
            got[j] = r
    finally:
        store.close()
    return got


def test_sigkill_during_saves_leaves_every_conversation_whole(tmp_path: Path) -> None:
    db = tmp_path / "conversations.sqlite"
    rounds = run_until(db, saves=12)  # 4 rounds each, then killed inside the 13th save
    first = check_whole(db, rounds)
    assert all(r >= 4 for r in first.values())
    more = run_until(db, saves=0, hold=True)  # carried on; killed inside its first save
    assert more[0] == {first[0] + 1}  # that save had begun
    for j in range(CONVERSATIONS):
        rounds[j] |= more[j]
    second = check_whole(db, rounds)
    assert second == first  # the save it was killed in left the old version, whole
