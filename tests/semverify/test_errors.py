"""Bad input gets a clear error that names the argument."""

import pytest
import torch

from semverify import Draft, PromptLookupDrafter, generate
from semverify.engine.loop import speculative_generate
from semverify.registry import get_rule
from semverify.rules import SpeculativeSampling
from tests.helpers import tiny_model

IDS = torch.arange(10)[None]


class NeedsProbs(SpeculativeSampling):
    name = "needs-probs"
    needs_draft_probs = True


class TreeDrafter(PromptLookupDrafter):
    def propose(self, input_ids, k, sampler=None, generator=None):
        return Draft(tokens=torch.tensor([[1, 2]]), parents=torch.tensor([-1, -1]))


@pytest.fixture(scope="module")
def target():
    return tiny_model(0)


def test_different_vocabularies(target):
    with pytest.raises(ValueError, match="assistant_model has a vocabulary of 80"):
        generate(target, IDS, assistant_model=tiny_model(1, vocab=80), max_new_tokens=4)


@pytest.mark.parametrize("k", [0, -2])
def test_draft_length_below_one(target, k):
    with pytest.raises(ValueError, match="num_assistant_tokens must be >= 1"):
        generate(target, IDS, assistant_model=target, num_assistant_tokens=k, max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens must be >= 1"):
        generate(target, IDS, prompt_lookup_num_tokens=k, max_new_tokens=4)


def test_negative_max_new_tokens(target):
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, IDS, max_new_tokens=-1)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        speculative_generate(target, IDS, drafter=PromptLookupDrafter(), rule=get_rule("greedy"),
                             k=2, max_new_tokens=-1)


def test_empty_prompt(target):
    with pytest.raises(ValueError, match="input_ids is empty"):
        generate(target, torch.empty(1, 0, dtype=torch.long), max_new_tokens=4)


def test_batches_must_be_left_padded_whole_prompts(target):
    ids = torch.arange(10).reshape(2, 5)
    with pytest.raises(ValueError, match="row 1 of the batch is padded on the right"):
        generate(target, ids, attention_mask=torch.tensor([[1] * 5, [1, 1, 1, 0, 0]]), max_new_tokens=4)
    with pytest.raises(ValueError, match="attention_mask has shape \\(2, 4\\) but input_ids \\(2, 5\\)"):
        generate(target, ids, attention_mask=torch.ones(2, 4), max_new_tokens=4)
    with pytest.raises(ValueError, match="row 0 of the batch is all padding"):
        generate(target, ids, attention_mask=torch.tensor([[0] * 5, [1] * 5]), max_new_tokens=4)
    with pytest.raises(ValueError, match="streamer takes one sequence"):
        generate(target, ids, streamer=object(), max_new_tokens=4)


def test_rule_needs_probabilities_the_drafter_lacks(target):
    with pytest.raises(ValueError, match="needs draft probabilities.*PromptLookupDrafter"):
        generate(target, IDS, rule=NeedsProbs(), prompt_lookup_num_tokens=3, max_new_tokens=4)


def test_unknown_rule_and_kwargs(target):
    with pytest.raises(ValueError, match="unknown acceptance rule 'nope'"):
        generate(target, IDS, rule="nope", max_new_tokens=4)
    with pytest.raises(TypeError, match="unexpected keyword arguments: not_a_setting"):
        generate(target, IDS, max_new_tokens=4, not_a_setting=3)


def test_unsupported_setting_is_named(target):
    with pytest.raises(NotImplementedError, match="num_beams=2"):
        generate(target, IDS, max_new_tokens=4, num_beams=2)


def test_two_drafters_at_once(target):
    with pytest.raises(ValueError, match="assistant_model and prompt_lookup_num_tokens"):
        generate(target, IDS, assistant_model=target, prompt_lookup_num_tokens=3, max_new_tokens=4)


def test_one_sequence_drafters_and_rules_that_extend_need_batch_size_one(target):
    class OneSequence(TreeDrafter):
        batching = "single"

    class Asks(SpeculativeSampling):
        name, needs_extend = "asks", True

    batch = torch.arange(10).reshape(2, 5)
    with pytest.raises(NotImplementedError, match="batch size 1"):
        generate(target, batch, drafter=OneSequence(), max_new_tokens=4)
    with pytest.raises(ValueError, match="rule 'asks' asks the target.*batch size 1"):
        generate(target, batch, rule=Asks(), max_new_tokens=4)
    generate(target, batch, drafter=TreeDrafter(), max_new_tokens=4)  # trees batch: one tree per row
    generate(target, batch[:1], rule=Asks(), max_new_tokens=4)


def test_sampled_trees_need_a_rule_that_samples_trees(target):
    with pytest.raises(NotImplementedError, match="rule 'typical' judges tree drafts path by path.*speculative"):
        generate(target, IDS, drafter=TreeDrafter(), rule="typical", max_new_tokens=4, do_sample=True)
    generate(target, IDS, drafter=TreeDrafter(), max_new_tokens=4, do_sample=True)  # speculative: sibling by sibling
    generate(target, IDS, drafter=TreeDrafter(), rule="typical", max_new_tokens=4)  # greedy: path by path


def test_tree_deeper_than_k_is_refused(target):
    class DeepTree(PromptLookupDrafter):
        def propose(self, input_ids, k, sampler=None, generator=None):
            return Draft(tokens=torch.tensor([[1, 2, 3]]), parents=torch.tensor([-1, 0, -1]))

    with pytest.raises(ValueError, match="2 tokens deep"):
        generate(target, IDS, drafter=DeepTree(), max_new_tokens=8, num_assistant_tokens=1)


def test_draft_shapes_are_checked():
    with pytest.raises(ValueError, match="batch, n"):
        Draft(tokens=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="probs must be"):
        Draft(tokens=torch.tensor([[1, 2]]), probs=torch.ones(1, 3, 5))
    with pytest.raises(ValueError, match="parents"):
        Draft(tokens=torch.tensor([[1, 2]]), parents=torch.tensor([0, 0]))
