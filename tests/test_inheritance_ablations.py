"""The paper's inheritance ablations copy exactly the parameters they name (spelled out by hand below for a 2-layer
student of a 4-layer GPT-2) and leave every other parameter at the student's fresh initialisation."""

import pytest
import torch

from lens_heads.growth.inherit import inherit, inherit_later_layers
from test_inheritune import perturbed, tiny_gpt2

ATTENTION = ("ln1.w", "ln1.b", "attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "attn.b_Q", "attn.b_K", "attn.b_V",
             "attn.b_O")
MLP = ("ln2.w", "ln2.b", "mlp.W_in", "mlp.b_in", "mlp.W_out", "mlp.b_out")
# the authors' GPT-2 ties the unembedding to the token embedding: its only own tensor is the bias
SHARED = {"embed.W_E": "embed.W_E", "unembed.b_U": "unembed.b_U"}

# student parameter -> the reference parameter it must equal (every other one: fresh init)
EXPECTED = {
    "later_layers": {**SHARED, **{f"blocks.{s}.{p}": f"blocks.{r}.{p}" for s, r in ((0, 2), (1, 3))
                                  for p in ATTENTION + MLP}},
    "attention_only": {**SHARED, **{f"blocks.{s}.{p}": f"blocks.{s}.{p}" for s in (0, 1) for p in ATTENTION}},
    "mlp_only": {**SHARED, **{f"blocks.{s}.{p}": f"blocks.{s}.{p}" for s in (0, 1) for p in MLP}},
}


def build(ablation, reference, seed):
    if ablation == "later_layers":
        return inherit_later_layers(reference, 2, seed=seed)
    return inherit(reference, 2, seed=seed, parts=ablation.removesuffix("_only"))


@pytest.mark.parametrize("ablation", sorted(EXPECTED))
def test_an_inheritance_ablation_copies_exactly_the_named_parameters(ablation):
    reference = perturbed(tiny_gpt2(4, seed=0), seed=1)  # every tensor moved off any fresh init
    student = build(ablation, reference, seed=5)
    ref, fresh = dict(reference.named_parameters()), dict(tiny_gpt2(2, seed=5).named_parameters())
    expected = EXPECTED[ablation]
    assert set(expected) <= set(fresh)  # the hand list names real parameters
    for name, tensor in student.named_parameters():
        if name in expected:
            assert torch.equal(tensor, ref[expected[name]]), f"{name} should be the reference's {expected[name]}"
        else:
            assert torch.equal(tensor, fresh[name]), f"{name} should stay at fresh init"
            assert not any(torch.equal(tensor, r) for r in ref.values() if r.shape == tensor.shape), name
