"""An embedding request's inputs as token lists: text tokenized, token ids checked, each
input within the model's context (the embed path's validation, one place).
Tested by tests/server/clients/test_embeddings.py and tests/server/test_big_inputs.py."""

from __future__ import annotations

from collections.abc import Sequence

from app.core.inference import prompt as prompting
from app.core.types import LoadedModel
from app.errors import ContextLengthExceeded, InvalidRequest


async def token_lists(lm: LoadedModel, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Each input's tokens.

    Raises:
        InvalidRequest: a token id outside the vocabulary, an empty input;
        ContextLengthExceeded: an input over the model's context.
    """
    token_lists: list[list[int]] = []
    vocab = int(lm.special_tokens.get("n_vocab") or 0)
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            toks = await prompting.tokenize(lm, item, f"input[{i}]", parse_special=False)
        else:
            toks = list(item)
            if vocab and any(t < 0 or t >= vocab for t in toks):
                raise InvalidRequest(f"token ids must be in [0, {vocab})", param=f"input[{i}]")
        if not toks:
            raise InvalidRequest("an input is empty", param=f"input[{i}]")
        if len(toks) > lm.context_length:
            raise ContextLengthExceeded(
                f"input {i} has {len(toks)} tokens; this model takes at most {lm.context_length}",
                param=f"input[{i}]",
            )
        token_lists.append(toks)
    return token_lists
