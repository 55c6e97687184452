"""A small language model as drafter, with its own KV cache rolled back to the accepted prefix."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..cache import keep_first, new_cache
from ..sampling import Sampler, sample_from
from ..types import Draft, eos_ids
from .base import BaseDrafter


class ModelDrafter(BaseDrafter):
    """Drafts k tokens autoregressively with ``model``, sampling through the loop's sampler.

    ``confidence_threshold`` stops a draft early once the draft's top probability falls below it
    (transformers' ``assistant_confidence_threshold`` idea): unlikely tokens waste draft forwards.
    A draft also ends at an end-of-sequence token (``eos_token_id``, by default the draft model's
    generation config): nothing after it would ever be emitted.
    """

    gives_probs = True
    needs_target_hidden = False

    def __init__(self, model: PreTrainedModel, confidence_threshold: float | None = None,
                 eos_token_id: int | list[int] | None = None) -> None:
        if confidence_threshold is not None and not 0.0 <= confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        self.model = model
        self.confidence_threshold = confidence_threshold
        if eos_token_id is None:
            eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos = set(eos_ids(eos_token_id))
        self.cache = None
        self._draft_start = 0

    def reset(self, input_ids: torch.LongTensor) -> None:
        self.cache = new_cache(self.model, role="draft model")

    def propose(
        self, input_ids: torch.LongTensor, k: int, sampler: Sampler, generator: torch.Generator | None
    ) -> Draft:
        return self.draft_tokens(input_ids, k, sampler, generator)[0]

    def draft_tokens(self, input_ids: torch.LongTensor, k: int, sampler: Sampler, generator: torch.Generator | None,
                     stop=None, keep_hidden: bool = False) -> tuple[Draft, torch.Tensor | None]:
        """Up to k tokens, and with ``keep_hidden`` the last-layer hidden states [B, n, H] of the positions
        that emitted them (else None); ``stop(tokens)`` ends the draft early after a token."""
        self._draft_start = input_ids.shape[1]
        feed = input_ids[:, self.cache.get_seq_length() :]
        tokens, probs, hidden = [], [], []
        for _ in range(k):
            out = self.model(input_ids=feed, cache=self.cache, use_cache=True, logits_to_keep=1,
                             output_hidden_states=keep_hidden)
            logits = out.logits[:, -1]
            if keep_hidden:
                hidden.append(out.hidden_states[-1][:, -1])
            q = sampler.probs(logits)
            token = sample_from(q, generator) if sampler.do_sample else logits.argmax(dim=-1)
            tokens.append(token)
            probs.append(q)
            feed = token[:, None]
            if self.confidence_threshold is not None and float(q.max()) < self.confidence_threshold:
                break
            if stop is not None and stop(tokens):
                break
            if self.eos and all(int(t) in self.eos for t in token):
                break
        if not tokens:
            return Draft.empty(input_ids.shape[0], input_ids.device), None
        draft = Draft(tokens=torch.stack(tokens, dim=1), probs=torch.stack(probs, dim=1))
        return draft, torch.stack(hidden, dim=1) if keep_hidden else None

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden=None) -> None:
        # The cache holds the prefix plus all draft tokens but the last; keep the accepted ones only.
        keep_first(self.cache, min(self.cache.get_seq_length(), self._draft_start + n_accepted))
