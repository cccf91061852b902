"""A tiny, real mlx-vlm model folder built by the tests: a LLaVA (CLIP vision tower, projector,
Llama text model) with random weights, a byte-level BPE tokenizer trained here with an
``<image>`` token, and the image processor's config (CLIP's, 32x32 pixels) written locally.

Everything mlx-vlm loads and runs is real: the processor resizes and normalises the pixels, the
vision tower encodes them, the projector puts 16 image embeddings where ``<image>`` was. The
model talks nonsense; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.mlx_model import CHATML, CORPUS, save_random_weights

IMAGE_SIZE = 32
PATCH = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # CLS is dropped ("default" feature strategy)


def build_tiny_mlx_vlm_model(folder: Path, *, hidden: int = 64, seed: int = 0) -> Path:
    import mlx.core as mx
    from mlx_vlm.models import llava
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<image>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    image_id = tok.token_to_id("<image>")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "<|im_end|>",
                "pad_token": "<pad>",
                "add_bos_token": False,
                "chat_template": CHATML,
            }
        )
    )
    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "CLIPImageProcessor",
                "do_resize": True,
                "size": {"shortest_edge": IMAGE_SIZE},
                "do_center_crop": True,
                "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": mean,
                "image_std": std,
                "do_convert_rgb": True,
                "resample": 3,
            }
        )
    )
    (folder / "processor_config.json").write_text(
        json.dumps(
            {
                "processor_class": "LlavaProcessor",
                "patch_size": PATCH,
                "vision_feature_select_strategy": "default",
                "image_token": "<image>",
                "num_additional_image_tokens": 1,
            }
        )
    )
    text = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "intermediate_size": hidden * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
    }
    vision = {
        "model_type": "clip_vision_model",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "projection_dim": 32,
        "num_channels": 3,
        "layer_norm_eps": 1e-5,
    }
    config = {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "text_config": text,
        "vision_config": vision,
        "image_token_index": image_id,
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
        "eos_token_id": tok.token_to_id("<|im_end|>"),
        "bos_token_id": tok.token_to_id("<s>"),
    }
    (folder / "config.json").write_text(json.dumps(config))
    mx.random.seed(seed)
    cfg = llava.ModelConfig.from_dict(config)
    cfg.text_config = llava.TextConfig.from_dict(text)
    cfg.vision_config = llava.VisionConfig.from_dict(vision)
    model = llava.Model(cfg)
    save_random_weights(model, folder)
    return folder
