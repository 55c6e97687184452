"""Shared fixtures: tiny random models built from configs (no downloads) and the real packaged models."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

TINY_VOCAB = 96


def tiny_model(seed: int, arch: str = "qwen2", vocab: int = TINY_VOCAB, layers: int = 2,
               sliding_window: int | None = None, init_std: float = 0.02):
    """A small random causal LM in fp32, eval mode, deterministic for ``seed``."""
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  eos_token_id=None, bos_token_id=None, pad_token_id=None, initializer_range=init_std)
    if sliding_window:
        common.update(use_sliding_window=True, sliding_window=sliding_window, max_window_layers=0)
    config = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
    torch.manual_seed(seed)
    model = (Qwen2ForCausalLM if arch == "qwen2" else LlamaForCausalLM)(config)
    return model.eval()


@pytest.fixture(scope="session")
def qwen_pair():
    """The default real pair in fp32 (exact comparisons), loaded once per session."""
    from semverify.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_model

    target, tokenizer = load_model(DEFAULT_TARGET, dtype="float32")
    draft, _ = load_model(DEFAULT_DRAFT, dtype="float32")
    yield target, draft, tokenizer
    del target, draft


@pytest.fixture(scope="session")
def smollm():
    from semverify.models import load_model

    return load_model("smollm2-135m-instruct", dtype="float32")


def byte_tokenizer():
    """A self-contained byte-level tokenizer with a ChatML-style chat template (no downloads)."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A local folder (tiny random llama + byte tokenizer) that load_model reads like any checkpoint."""
    folder = tmp_path_factory.mktemp("tiny-checkpoint")
    tok = byte_tokenizer()
    model = tiny_model(0, arch="llama", vocab=len(tok))
    model.config.eos_token_id = tok.eos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
