"""Every architecture: tiny random models built from the configs of the decoder-only families transformers ships
(no downloads), decoded by the loop and compared with transformers' own ``generate`` in float32.

Each family decodes a left-padded batch whose rows run well past the sliding window (8 tokens) with draft-model
chains, draft-model trees and prompt lookup, and one row alone; coupled sampling gives the target alone's tokens;
a representative subset also decodes with retrieval, whole-step drafts, lookup-first hybrids and adaptive chains
verified in groups by length. Architectures the loop cannot serve are refused before decoding, with the reason.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from semverify import HybridDrafter, ModelDrafter, ModelTreeDrafter, NoDrafter, PromptLookupDrafter, generate
from semverify.engine.architectures import UnsupportedArchitectureError, layer_types, layout, unsupported_reason
from semverify.engine.coupling import CoupledNoise
from tests.helpers import byte_tokenizer

TOK = byte_tokenizer()  # the models' vocabulary is the byte tokenizer's, so step drafts can find their breaks
WINDOW = 8
NEW = 24
LENGTHS = (5, 13, 9)  # the rows' prompt lengths: every row runs past the window, the longest from its prompt on

SIZES = dict(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=256, sliding_window=WINDOW,
             attention_chunk_size=WINDOW, n_embd=32, n_layer=2, n_head=4, n_positions=256, n_inner=64, ffn_dim=64,
             word_embed_proj_dim=32, n_ctx=256, rotary_dim=4, num_experts=4, num_local_experts=4, n_routed_experts=4,
             num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, pad_token_id=0,
             bos_token_id=1, eos_token_id=None, initializer_range=0.2)
SLIDING, FULL, CHUNKED = "sliding_attention", "full_attention", "chunked_attention"
DROP = object()  # an override that leaves the config's default

# family: (model_type, config overrides, the layer types its tiny model must have)
FAMILIES = {
    # every layer sees every earlier token
    **{t: (t, {}, {FULL}) for t in (
        "llama", "gemma", "phi", "olmo", "olmo2", "granite", "cohere", "stablelm", "gpt_neox", "gpt2", "glm", "glm4",
        "helium", "seed_oss", "arcee", "apertus", "gptj", "opt", "bloom", "olmoe", "granitemoe", "granitemoeshared",
        "codegen", "gpt_bigcode", "mpt", "xglm", "biogpt", "ctrl", "ernie4_5", "ernie4_5_moe", "hunyuan_v1_dense",
        "nemotron", "persimmon", "jetmoe", "diffllama", "bitnet", "glm4_moe", "flex_olmo", "minimax_m2", "nanochat",
        "internlm3", "exaone", "lfm2")},
    "mistral": ("mistral", {"sliding_window": None}, {FULL}),
    "qwen2": ("qwen2", {"use_sliding_window": False}, {FULL}),
    "falcon": ("falcon", {"head_dim": DROP}, {FULL}),
    # every layer sees a window
    **{t: (t, {}, {SLIDING}) for t in ("ministral", "ministral3", "mixtral", "phi3", "phimoe", "starcoder2", "doge",
                                       "kolibri1", "afmoe", "cohere2_moe", "exaone_moe")},
    "mistral-sliding": ("mistral", {}, {SLIDING}),
    "qwen3_moe": ("qwen3_moe", {"use_sliding_window": True, "max_window_layers": 0}, {SLIDING}),
    "llama4_text": ("llama4_text", {}, {CHUNKED}),
    # full and sliding layers side by side (one mask per layer type)
    "qwen2-sliding": ("qwen2", {"use_sliding_window": True, "max_window_layers": 1}, {FULL, SLIDING}),
    "qwen3": ("qwen3", {"use_sliding_window": True, "max_window_layers": 1}, {FULL, SLIDING}),
    "qwen2_moe": ("qwen2_moe", {"use_sliding_window": True, "max_window_layers": 1}, {FULL, SLIDING}),
    "gemma2": ("gemma2", {}, {FULL, SLIDING}),
    "gemma3_text": ("gemma3_text", {"layer_types": [SLIDING, FULL]}, {FULL, SLIDING}),
    "cohere2": ("cohere2", {"layer_types": [SLIDING, FULL]}, {FULL, SLIDING}),
    "exaone4": ("exaone4", {"layer_types": [SLIDING, FULL]}, {FULL, SLIDING}),
    "olmo3": ("olmo3", {"layer_types": [SLIDING, FULL]}, {FULL, SLIDING}),
    "smollm3": ("smollm3", {"use_sliding_window": True, "no_rope_layer_interval": 2}, {FULL, SLIDING}),
    "gpt_oss": ("gpt_oss", {}, {FULL, SLIDING}),
    "granite_swa": ("granite_swa", {}, {FULL, SLIDING}),
    "vaultgemma": ("vaultgemma", {}, {FULL, SLIDING}),
    "cwm": ("cwm", {}, {FULL, SLIDING}),
    "mimo_v2_flash": ("mimo_v2_flash", {}, {FULL, SLIDING}),
}
SUBSET = ["llama", "mistral-sliding", "gemma2", "gemma3_text", "cohere2", "qwen2-sliding", "gpt_oss", "llama4_text"]
# no position_ids: trees are refused (BLOOM's ALiBi comes from the 2-D mask, so its batches work; MPT's from cache
# columns, which a batch's holes would shift, so it decodes one row at a time)
NO_TREES, NO_BATCHES = {"bloom", "mpt"}, {"mpt"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run several times faster on one thread (and do not fight other processes for cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(model_type: str, seed: int = 0, **overrides):
    """A tiny random causal LM of ``model_type`` in fp32, eval mode: the sizes above wherever its config has them."""
    base = AutoConfig.for_model(model_type)
    settings = {k: v for k, v in {**SIZES, **overrides}.items() if hasattr(base, k) and v is not DROP}
    config = AutoConfig.for_model(model_type, **settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    for name, value in (("eos_token_id", None), ("use_cache", True), ("decoder_start_token_id", None)):
        setattr(model.generation_config, name, value)
    return model


@functools.cache
def pair(family: str):
    """The family's target and its draft: the target with a perturbed output layer, so it agrees often but not
    always and a batch's rows keep different numbers of draft tokens (holes)."""
    model_type, overrides, _ = FAMILIES[family]
    target = build(model_type, **overrides)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        head = draft.get_output_embeddings().weight
        head += 0.5 * head.std() * torch.randn(head.shape, generator=torch.Generator().manual_seed(1))
    return target, draft


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of different lengths (ids, attention mask); token 0 pads."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, len(TOK), (n,), generator=g) for n in LENGTHS]
    width = max(LENGTHS)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    return ids, mask


@functools.cache
def reference(family: str) -> torch.Tensor:
    """transformers' batched greedy output on `batch`."""
    target, _ = pair(family)
    ids, mask = batch()
    with torch.inference_mode():
        return target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)


def decode(family: str, ids: torch.Tensor, mask: torch.Tensor | None = None, **kwargs):
    """`semverify.generate` on the family's target: NEW tokens, greedy unless ``kwargs`` say otherwise."""
    target, _ = pair(family)
    kwargs.setdefault("num_assistant_tokens", 4)
    return generate(target, ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0,
                    return_dict_in_generate=True, **kwargs)


DRAFTING = {
    "chain": lambda draft: dict(assistant_model=draft),
    "tree": lambda draft: dict(drafter=ModelTreeDrafter(draft, budget=6, branch=2, threshold=0.9)),
    "prompt lookup": lambda draft: dict(prompt_lookup_num_tokens=3),
}


def test_every_family_builds_with_the_layer_types_it_is_meant_to_test():
    for family, (_, _, types) in FAMILIES.items():
        target, _ = pair(family)
        assert set(layer_types(target.config)[0]) == types, family
        assert unsupported_reason(target) is None, family
        assert layout(target).windowed == (types != {FULL}), family


@pytest.mark.parametrize("drafting", list(DRAFTING))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_padded_batch_past_the_window_equals_transformers(family, drafting):
    _, draft = pair(family)
    ids, mask = batch()
    if family in NO_BATCHES or family in NO_TREES and drafting == "tree":
        with pytest.raises(UnsupportedArchitectureError, match="one row" if family in NO_BATCHES else "position_ids"):
            decode(family, ids, mask, **DRAFTING[drafting](draft))
        return
    out = decode(family, ids, mask, **DRAFTING[drafting](draft))
    assert torch.equal(out.sequences, reference(family))
    if drafting != "prompt lookup":  # drafts were kept and rejected: rows held holes
        assert 0 < out.spec_stats.accepted < out.spec_stats.drafted


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_row_equals_transformers(family):
    _, draft = pair(family)
    ids, _ = batch()
    row = ids[1:2, -LENGTHS[1] :]  # the longest row: past the window from its prompt on
    for drafting in ("chain",) if family in NO_TREES else ("chain", "tree"):
        out = decode(family, row, **DRAFTING[drafting](draft)).sequences
        assert torch.equal(out[0, row.shape[1] :], reference(family)[1, ids.shape[1] :]), drafting


@pytest.mark.parametrize("family", list(FAMILIES))
def test_coupled_sampling_equals_the_target_alone(family):
    _, draft = pair(family)
    ids, mask = batch()
    sampling = dict(do_sample=True, temperature=0.8)
    rows = [(ids[r : r + 1, -n:], None, [CoupledNoise(20 + r)]) for r, n in enumerate(LENGTHS)]
    batched = [(ids, mask, [CoupledNoise(20 + r) for r in range(len(LENGTHS))])]
    out = torch.cat([decode(family, x, m, generator=noise, assistant_model=draft, **sampling).sequences[:, x.shape[1] :]
                     for x, m, noise in (rows if family in NO_BATCHES else batched)])
    for r, (x, _, noise) in enumerate(rows):
        alone = decode(family, x, generator=noise[0], drafter=NoDrafter(), **sampling).sequences
        assert torch.equal(out[r], alone[0, x.shape[1] :]), r


# -- more drafters, on a representative subset ----------------------------------------------------------------------


def retrieval(family: str, tmp_path):
    """A retrieval drafter over a tiny datastore of the family's own continuations of `batch`, every fifth token
    changed: its drafts are right for a while, then wrong."""
    from semverify.sense.build import build_datastore
    from semverify.sense.drafter import RetrievalDrafter

    target, _ = pair(family)
    ids, mask = batch()
    states, tokens = [], []
    with torch.inference_mode():
        for r, n in enumerate(LENGTHS):
            text = reference(family)[r, ids.shape[1] - n :].clone()
            text[n + 4 :: 5] = (text[n + 4 :: 5] + 7) % len(TOK)
            hidden = target(text[None], output_hidden_states=True).hidden_states[-1][0]
            states.append(hidden[n - 1 : -1].half())
            tokens.append(text[n:].int())
    torch.save({"states": states, "tokens": tokens}, tmp_path / "shard00000.pt")
    return RetrievalDrafter(build_datastore(tmp_path, dim=8), num_candidates=4)


def steps(draft):
    """Whole-step drafts under a rule that rejects every step: the target then writes each step, helped by
    token drafts (lossless)."""
    from semverify.semanticspec import StepDrafter, StepLikelihood, StepSegmenter

    drafter = StepDrafter(draft, StepSegmenter(TOK, stops=("\ufffd", " ", "e"), max_step_tokens=6), token_k=3)
    return dict(drafter=drafter, rule=StepLikelihood(min_mean_logprob=0.1), num_assistant_tokens=6)


MORE = {
    "retrieval": lambda family, draft, tmp_path: dict(drafter=retrieval(family, tmp_path), num_assistant_tokens=6),
    "steps": lambda family, draft, tmp_path: steps(draft),
    "hybrid": lambda family, draft, tmp_path: dict(drafter=HybridDrafter(ModelDrafter(draft), PromptLookupDrafter(3))),
    "adaptive, verified by length": lambda family, draft, tmp_path: dict(
        drafter=ModelDrafter(draft, adaptive=True, start=2), num_assistant_tokens=6),
}


@pytest.mark.parametrize("drafting", list(MORE))
@pytest.mark.parametrize("family", SUBSET)
def test_more_drafters_on_a_padded_batch_past_the_window_equal_transformers(family, drafting, tmp_path,
                                                                             monkeypatch):
    from semverify.engine import width_groups

    monkeypatch.setattr(width_groups, "FORWARD_OVERHEAD", 0)  # rows of different draft lengths verified apart
    _, draft = pair(family)
    ids, mask = batch()
    out = decode(family, ids, mask, **MORE[drafting](family, draft, tmp_path))
    assert torch.equal(out.sequences, reference(family))
    assert out.spec_stats.drafted > 0 and (drafting == "steps" or out.spec_stats.accepted > 0)


# -- the regression of issue 62 -----------------------------------------------------------------------------------


def test_issue_62_sliding_window_batches_and_trees_equal_transformers():
    """A left-padded batch past the window gave other tokens on Mistral with a sliding window (chains) and stopped
    on Gemma 2, Gemma 3, EXAONE 4 and Mistral (trees: the sliding layers' caches were narrower than the full ones)."""
    for family in ("mistral-sliding", "gemma2", "gemma3_text", "exaone4"):
        _, draft = pair(family)
        ids, mask = batch()
        for drafting in ("chain", "tree"):
            out = decode(family, ids, mask, **DRAFTING[drafting](draft))
            assert torch.equal(out.sequences, reference(family)), (family, drafting)


# -- refused architectures ----------------------------------------------------------------------------------------

REFUSED = {  # model_type: (config overrides, what the refusal says)
    "mamba": ({}, "recurrent state"),
    "falcon_mamba": ({}, "recurrent state"),
    "rwkv": ({}, "takes no transformers cache"),
    "openai-gpt": ({}, "takes no transformers cache"),
    "recurrent_gemma": ({}, "linear_attention"),
    "qwen3_next": ({}, "linear_attention"),
    "qwen3_5_text": ({}, "linear_attention"),
    "lara_mini": ({}, "linear_attention"),
    "nemotron_h": ({}, "linear_attention"),
    "inkling_text": ({}, "hybrid_sliding"),
    "hy_v4": ({}, "indexed_attention"),
    "deepseek_v4": ({}, "compressed"),
    "moshi": ({}, "not in its attention masks"),
    "gpt_neo": ({"attention_types": [[["global", "local"], 1]], "num_layers": 2, "window_size": WINDOW},
                "local attention"),
}


@pytest.mark.parametrize("model_type", list(REFUSED))
def test_an_architecture_the_loop_cannot_serve_is_refused_before_decoding(model_type):
    overrides, why = REFUSED[model_type]
    model = build(model_type, **overrides)
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.raises(UnsupportedArchitectureError, match=why) as info:
        generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=4, prompt_lookup_num_tokens=2)
    assert not calls, "refused only after a forward"
    assert model_type in str(info.value) and type(model).__name__ in str(info.value)


transformers.logging.set_verbosity_error()
