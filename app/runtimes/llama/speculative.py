"""Speculative decoding by prompt lookup (llama-server's ``--spec-type ngram``), for a sequence
decoding alone: the last NGRAM tokens are looked up in the sequence's own tokens (prompt and
answer so far); the tokens that followed their latest earlier occurrence are a draft, decoded
in one batch with the pending token. Each row's logits go through the sequence's own sampler
chain in order, exactly as one-token steps would (grammar, penalties, seed and logprobs
included), and the draft is kept up to the first token the sampler did not pick; that pick
is the next token, and the cells of the rest are dropped. A repeat or an edit of a document
comes out several tokens a step. Answers are those of plain decoding up to a near tie: once
attention reads 512 cells, llama.cpp's CPU backend computes a one-token step's attention in
parts merged afterwards and a batch's rows in one pass, so their logits differ slightly
(docs/runtime.md).

It is off by default (load option ``speculative`` "ngram" turns it on: on an AMD EPYC a
draft's extra rows cost more than on the Xeons it was measured on, and prose came out 0.88x as
fast) and, on, switches itself off per request
when its drafts stop being kept (``Drafts.kept``): a draft of k tokens is decoded as k+1 rows,
and a row beyond the first costs a step about ROW_COST of a one-row step, so a draft pays
while more than ROW_COST of its tokens are kept on average. Once OFF_AFTER tokens were drafted
with fewer than OFF_SHARE of them kept, the request drafts no more (nor looks up: prose then
pays nothing); until then a one-token draft that missed skips PAUSE lookups.
Tested by tests/runtimes/llama/test_speculative.py."""

from __future__ import annotations

import array
from typing import TYPE_CHECKING, Any

from app.runtimes.llama.backend import L

if TYPE_CHECKING:
    from app.runtimes.worker import Sequence

NGRAM = 3  # tokens looked up
DRAFT_MAX = 16  # the longest draft
DRAFT_FIRST = 4  # the first draft's length; doubled when all of it is kept, halved when not
PAUSE = 16
# what a drafted row beyond the first adds to a decode step, as a share of a one-row step:
# SmolLM2 on 2 Xeon cores at ~500 cells, medians of 25 interleaved rounds, 0.26 (5 rows), 0.34
# (9), 0.32 (17); a busy machine, so rounded up. A draft of k tokens of which a are kept gives
# a+1 tokens for 1 + ROW_COST*k steps: it pays while a/k > ROW_COST
ROW_COST = 0.35
OFF_AFTER = 32  # drafted tokens a request is judged on (two full drafts, or a few misses)
OFF_SHARE = ROW_COST  # kept below this share of them: drafting costs more than it saves


class Drafts:
    """A sequence's next draft's length, and the lookup. The tokens are searched as bytes (C
    speed, and no index to keep: a dict of n-gram tuples held a Python object per position)."""

    __slots__ = ("size", "pause", "drafted", "accepted", "off")

    def __init__(self) -> None:
        self.size = DRAFT_FIRST
        self.pause = 0  # lookups to skip: drafts of one token kept missing
        self.drafted = 0  # tokens drafted so far, and those kept
        self.accepted = 0
        self.off = False  # its drafts stopped paying: one token a step from here on

    def propose(self, tokens: list[int], room: int) -> list[int]:
        """Up to ``min(size, room)`` tokens that followed the last NGRAM tokens the latest
        time they came before."""
        n = NGRAM
        if self.off or len(tokens) <= n or room < 1:
            return []
        if self.pause:
            self.pause -= 1
            return []
        # 8 bytes a token: an image's pseudo-ids go down to -2**62 (core/images.py)
        hist = array.array("q", tokens).tobytes()
        key = hist[-8 * n :]
        # an earlier occurrence with a token after it: it ends before the last token
        pos = hist.rfind(key, 0, len(hist) - 8)
        while pos > 0 and pos % 8:  # matched across token boundaries: look further back
            pos = hist.rfind(key, 0, pos + len(key) - 1)
        if pos < 0 or pos % 8:
            return []
        start = pos // 8 + n
        draft = tokens[start : start + min(self.size, room)]
        for i, t in enumerate(draft):
            if t < 0:  # an image's place: never drafted
                return draft[:i]
        return draft

    def kept(self, proposed: int, accepted: int) -> None:
        """How a draft went: the next one is longer after a whole draft was kept, shorter
        after a miss; after a one-token draft missed, PAUSE lookups are skipped (prose that
        only happens to repeat three tokens would pay for drafts it never keeps). Once
        OFF_AFTER tokens were drafted, fewer than OFF_SHARE of them kept turns drafting off."""
        self.drafted += proposed
        self.accepted += accepted
        if self.drafted >= OFF_AFTER and self.accepted < OFF_SHARE * self.drafted:
            self.off = True
        if accepted == proposed:
            self.size = min(DRAFT_MAX, self.size * 2)
        elif accepted == 0 and self.size == 1:
            self.pause = PAUSE
        else:
            self.size = max(1, self.size // 2)


class Speculation:
    """Mixed into LlamaEngine: the drafted step."""

    ctx: Any
    mem: Any
    batch: Any
    n_batch: int
    n_ctx: int
    slots: Any

    def _speculate(self, seq: Sequence, st: Any) -> bool:
        """One step of ``seq`` (decoding alone, its pending token appended to its cache list)
        with a draft; False (nothing done) when there is none or the cache has no room."""
        kv: list[int] = self.slots.kv[st.slot]
        if st.drafts is None:
            st.drafts = Drafts()
        room = min(self.n_batch - 1, self.n_ctx - 2 - st.pos)  # the batch; the context
        draft = st.drafts.propose(kv, room)
        if not draft:
            return False
        rows = [kv[-1], *draft]
        for i, t in enumerate(rows):
            self._put(i, t, st.pos + i, st.slot, logits=True)  # type: ignore[attr-defined]
        self.batch.n_tokens = len(rows)
        rc = self._decode()  # type: ignore[attr-defined]
        if rc != 0:
            L.llama_memory_seq_rm(self.mem, st.slot, st.pos, -1)
            if rc == 1:
                return False  # no room for the draft: the one-token step decides
            self._fail([seq], rc)  # type: ignore[attr-defined]
        kept = 0
        for i in range(len(rows)):
            self._decoded(seq, st, 1)  # type: ignore[attr-defined]  # row i is in the cache
            self._sample(seq, st, i)  # type: ignore[attr-defined]  # picks (and sends) st.next
            if seq.finish_reason is not None or i == len(draft) or st.next != draft[i]:
                break
            kv.append(draft[i])  # the pick is the drafted token, already decoded in row i+1
            st.next = None
            kept += 1
        L.llama_memory_seq_rm(self.mem, st.slot, st.pos, -1)  # the rows past the last pick
        st.drafts.kept(len(draft), kept)
        seq.drafted += len(draft)
        seq.draft_kept += kept
        return True
