"""KV accounting: which key/value groups removed heads free, checked against an explicit loop over the mapping
expand_kv encodes, and against the pruned model itself (a freed group's cache no longer reaches the output)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from lens_heads import InputError
from lens_heads.ablation.kv_cache import freed_groups, kv_account, kv_share
from lens_heads.ablation.prune import prune
from lens_heads.models.loading import expand_kv
from test_prune import hf_folder


@pytest.mark.parametrize("n_kv", [1, 2, 3, 6])
def test_a_group_is_freed_only_when_every_head_it_serves_is_removed(n_kv):
    g = torch.Generator().manual_seed(n_kv)
    removed = torch.rand(5, 3, 6, generator=g) < 0.6  # [input, layer, head]
    removed[0, 0] = True  # a whole layer, so every n_kv frees something
    # the group each query head reads, as expand_kv repeats key/value heads
    group_of = expand_kv(torch.arange(n_kv, dtype=torch.float)[None, None, :, None], 6)[0, 0, :, 0].long()
    want = torch.zeros(5, 3, n_kv, dtype=torch.bool)
    for i in range(5):
        for layer in range(3):
            for kv in range(n_kv):
                served = [h for h in range(6) if group_of[h] == kv]
                want[i, layer, kv] = all(bool(removed[i, layer, h]) for h in served)
    assert torch.equal(freed_groups(removed, n_kv), want)
    torch.testing.assert_close(kv_share(removed, n_kv), want.flatten(1).double().mean(1).float())
    with pytest.raises(InputError, match="can't be split into 4 key/value groups"):
        freed_groups(removed, 4)


def test_kv_account_counts_groups_and_dropped_blocks():
    cfg = SimpleNamespace(n_layers=4, n_heads=4, n_key_value_heads=2, d_head=16)
    account = kv_account(cfg, heads=[(0, 0), (0, 1), (1, 2)], layers=[3], part="block")
    # layer 0 group 0 (heads 0, 1) and both groups of layer 3: 3 of 8 groups; head (1, 2) alone frees nothing
    assert account.freed.tolist() == [[True, False], [False, False], [False, False], [True, True]]
    assert account.accounted == 3 / 8 and account.physical == 1 / 4
    assert account.bytes_per_token == 2 * 4 * 2 * 16 * 4
    assert kv_account(cfg, layers=[3], part="attention").physical == 0.0  # a zeroed attention still caches
    with pytest.raises(InputError, match=r"head \(0, 4\) is outside"):
        kv_account(cfg, heads=[(0, 4)])
    assert kv_account(cfg, bytes_per_value=2).bytes_per_token == 2 * 4 * 2 * 16 * 2
    for bad in (0, -2, float("nan"), float("inf"), True, "2"):
        with pytest.raises(InputError, match="size of one cached value in bytes, a positive number"):
            kv_account(cfg, bytes_per_value=bad)


def test_a_freed_group_s_cache_no_longer_reaches_the_pruned_model_s_output(tmp_path):
    """In the exported model, scrambling the cached keys and values of a group whose heads are all removed leaves
    the next token's logits bit for bit (its heads' outputs meet zeroed o_proj columns: exact zeros); scrambling a
    group that still serves one head changes them."""
    folder = hf_folder(tmp_path / "source", "llama")  # 4 layers, 4 query heads, 2 KV heads
    heads = [(0, 0), (0, 1), (1, 2)]
    out = prune(str(folder), heads=heads).save(tmp_path / "pruned")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    freed = kv_account(SimpleNamespace(n_layers=4, n_heads=4, n_key_value_heads=2, d_head=16), heads=heads).freed
    prompt = torch.randint(0, 101, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = hf(prompt, use_cache=True).past_key_values
        base = hf(torch.tensor([[5]]), past_key_values=copy.deepcopy(cache)).logits

        def scrambled(layer: int, kv: int) -> torch.Tensor:
            c = copy.deepcopy(cache)
            for t in (c.layers[layer].keys, c.layers[layer].values):
                t[:, kv] = torch.randn(t[:, kv].shape, generator=torch.Generator().manual_seed(1))
            return hf(torch.tensor([[5]]), past_key_values=c).logits

        for layer, kv in [(0, 0), (0, 1), (1, 1), (2, 0)]:
            if freed[layer, kv]:
                assert torch.equal(scrambled(layer, kv), base), (layer, kv)
            else:
                assert (scrambled(layer, kv) - base).abs().max() > 1e-4, (layer, kv)
    assert freed[0, 0] and not freed[1, 1]  # both branches ran
