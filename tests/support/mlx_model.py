"""A tiny, real MLX model folder built by the tests: config.json + safetensors + tokenizer.json.

The weights are random (seeded) and the tokenizer is a small byte-level BPE trained here, so the
model talks nonsense, but every part mlx-lm loads and runs is real.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a cat sits on the mat and the sea is blue",
    "hello world, how are you today? I am fine, thank you.",
    "Hearth runs models on your own machine. Lighthouses stand by the sea.",
] * 20


FIM_SPECIALS = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<file_sep>"]  # StarCoder's


def build_tiny_mlx_model(
    folder: Path, *, layers: int = 2, hidden: int = 64, seed: int = 0, fim: bool = False
) -> Path:
    """``fim``: its tokenizer also has StarCoder's fill-in-the-middle tokens."""
    import mlx.core as mx
    from mlx_lm.models import llama
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", *(FIM_SPECIALS if fim else [])]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "<|im_end|>",
                "add_bos_token": False,
                "chat_template": CHATML,
            }
        )
    )
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
        "eos_token_id": tok.token_to_id("<|im_end|>"),
        "bos_token_id": tok.token_to_id("<s>"),
    }
    (folder / "config.json").write_text(json.dumps(config))
    mx.random.seed(seed)
    args = llama.ModelArgs.from_dict(config)
    model = llama.Model(args)
    save_random_weights(model, folder)
    return folder


def save_random_weights(model, folder: Path) -> None:  # type: ignore[no-untyped-def]
    """Random, larger-than-default weights (so greedy decoding wanders over the vocabulary and
    an image moves the logits visibly) saved as ``folder/model.safetensors``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = {
        k: (
            mx.random.normal(v.shape) * (1.0 if "norm" in k else 0.3)
            + (1.0 if "norm" in k else 0.0)
        ).astype(mx.float16)
        for k, v in tree_flatten(model.parameters())
    }
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
