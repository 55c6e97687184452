"""The block argmax the loop takes over the vocabulary equals torch.argmax, ties and odd vocabularies included."""

import pytest
import torch

from semverify.engine.argmax import BLOCK, vocab_argmax


@pytest.mark.parametrize("vocab", [5, 4 * BLOCK, 4 * BLOCK + 1, 151_936, 151_939, 32_003])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_argmax_equals_torch_argmax(vocab, dtype):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, 4, vocab, generator=g).to(dtype)
    assert torch.equal(vocab_argmax(logits), logits.argmax(dim=-1))


def test_ties_go_to_the_first_index_across_and_inside_blocks():
    logits = torch.zeros(4, 3 * BLOCK + 7)
    logits[0, [5, BLOCK + 5]] = 1.0            # tie across blocks
    logits[1, [BLOCK + 1, BLOCK + 2]] = 2.0    # tie inside a block
    logits[2, [BLOCK - 1, 3 * BLOCK + 3]] = 3.0  # tie between a block and the tail
    logits[3, 3 * BLOCK + 6] = 4.0             # maximum in the tail alone
    coarse = torch.randint(0, 3, (6, 2_000), generator=torch.Generator().manual_seed(0)).float()
    for x in (logits, coarse, torch.zeros(2, 5_000)):
        assert torch.equal(vocab_argmax(x), x.argmax(dim=-1))


def test_masked_and_strided_logits():
    x = torch.randn(2, 6, 3_000, generator=torch.Generator().manual_seed(1))
    x[..., :2_000] = float("-inf")  # a top-k warp leaves most of the vocabulary at -inf
    strided = x[:, ::2]
    assert torch.equal(vocab_argmax(strided), strided.argmax(dim=-1))
    assert torch.equal(vocab_argmax(x.reshape(-1, 3_000)), x.reshape(-1, 3_000).argmax(dim=-1))
    assert vocab_argmax(torch.randn(0, 3_000)).shape == (0,)
