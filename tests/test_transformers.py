"""The transformers integration on the CPU (flashattn's CPU path is the fp32
reference): a tiny random Llama/Mistral with attn_implementation="fattn" gives the
logits, gradients and greedy tokens of the same model under SDPA. No download."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashattn.integrations.transformers as flashattn_hf
from _hf_models import SDPA, padded_batch, tiny_config, tiny_model

NAME = flashattn_hf.register()


def _logits(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("kind", ["llama", "mistral"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_logits_and_grads_match_sdpa(kind, side):
    config = tiny_config(kind)
    ours, sdpa = tiny_model(config, NAME), tiny_model(config, SDPA)
    ids, mask = padded_batch([40, 17, 1, 33], 40, side)
    real = mask.bool()
    got, want = _logits(ours, ids, mask), _logits(sdpa, ids, mask)
    torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-4)
    got[real].square().mean().backward()
    want[real].square().mean().backward()
    for (name, p), q in zip(ours.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=name)


def test_packed_position_ids_equal_separate_sequences():
    config = tiny_config()
    ours = tiny_model(config, NAME)
    lengths = [11, 30, 5]
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, 512, (n,), generator=g) for n in lengths]
    packed = torch.cat(seqs)[None]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    logits = ours(input_ids=packed, position_ids=position_ids).logits[0]
    start = 0
    for s in seqs:
        alone = ours(input_ids=s[None]).logits[0]
        torch.testing.assert_close(logits[start:start + len(s)], alone, rtol=1e-4, atol=1e-4)
        start += len(s)


def test_greedy_generation_matches_sdpa():
    config = tiny_config()
    ours, sdpa = tiny_model(config, NAME), tiny_model(config, SDPA)
    ids, mask = padded_batch([12, 7], 12, "left", seed=3)
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    torch.testing.assert_close(ours.generate(ids, attention_mask=mask, **kwargs),
                               sdpa.generate(ids, attention_mask=mask, **kwargs), rtol=0, atol=0)


def test_a_name_with_flash_is_refused():
    with pytest.raises(ValueError, match="flash"):
        flashattn_hf.register("my_flash")
