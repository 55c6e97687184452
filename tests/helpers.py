"""Helpers the tests share: tiny random models built from configs (no downloads), a self-contained
byte-level tokenizer, and a local checkpoint folder made of the two."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from semverify.types import Verdict, VerifyInput

TINY_VOCAB = 96
REPO = Path(__file__).resolve().parents[1]


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
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% if not (loop.last and continue_final_message) %}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


def save_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A local folder (tiny random llama + byte tokenizer) that load_model reads like any checkpoint."""
    tok = byte_tokenizer()
    model = tiny_model(seed, arch="llama", vocab=len(tok))
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def check_verdict_bounds(x: VerifyInput, v: Verdict) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared properties of any verdict: 0 <= n <= k, an in-vocabulary next token the target can emit."""
    B, k, V = x.draft.tokens.shape[0], x.k, x.target_logits.shape[-1]
    n, nxt = v.n_accepted, v.next_token
    assert n.shape == (B,) and nxt.shape == (B,)
    assert bool(((n >= 0) & (n <= k)).all())
    assert bool(((nxt >= 0) & (nxt < V)).all())
    assert bool((x.target_probs[torch.arange(B), n, nxt] > 0).all()), "next token has target probability 0 at n"
    return n, nxt


def run_row(i: int, method: str, tok_s: float, machine: str | None = None, output: str = "So the total is 5.",
            grades: tuple[bool, bool, bool] = (False, True, True)) -> dict:
    """A GSM8K run row (gold answer 5) as `semverify compare` writes it, for report tests; ``grades`` are
    the stored strict, flexible and math-verify grades, and rows without ``machine`` predate that field."""
    row = {"id": i, "method": method, "gold": "5", "output": output,
           "grades": dict(zip(("strict", "flexible", "math_verify"), grades)), "new_tokens": 10, "steps": 10,
           "drafted": 0, "accepted": 0, "drafted_per_position": [], "accepted_per_position": [], "reasons": {},
           "scores": {}, "total_time": 1.0, "tok_s": tok_s}
    return row if machine is None else {**row, "machine": machine}
