"""batch_size="auto" (halving on out-of-memory, faked by a hook on the CPU) and reduced-precision models."""

import pytest
import torch

from conftest import text_model
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.data.tasks import load_task
from lens_heads.evaluation import batching
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.heads.scoring import score_heads
from lens_heads.models.loading import tiny_model
from lens_heads.plumbing.errors import InputError


@pytest.fixture(scope="module")
def tiny_text_model():
    return text_model(n_layers=2)


def memory_limit(max_rows: int, tried: list, error=lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to "
                                                                               "allocate 2.00 GiB")):
    """A hook that fails like an exhausted GPU when a forward pass holds more than ``max_rows`` rows."""

    def hook(x, hook=None):
        tried.append(x.shape[0])
        if x.shape[0] > max_rows:
            raise error()

    return ("blocks.0.hook_resid_pre", hook)


def test_first_size_is_a_power_of_two_capped_by_the_rows():
    assert batching.first_size("cpu", 1000) == batching.DEFAULT_START
    assert batching.first_size("cpu", 5) == 8 and batching.first_size("cpu", 1) == 1
    assert batching.first_size("cuda:3", 10_000) == batching.AUTO_START["cuda"]


def test_auto_batch_halves_on_out_of_memory_until_it_fits(tiny_text_model):
    model, task = tiny_text_model, load_task("arc_easy", split="validation", n=4, seed=1)  # 16 rows: first try 16
    tried = []
    auto = evaluate(model, task, hooks=[memory_limit(3, tried)], batch_size="auto", progress=False)
    # 16, 8 and 4 rows per batch each fail at their first (longest, 4-row) batch; 2 fits
    assert sum(rows > 3 for rows in tried) == 3 and auto.meta["batch_size"] == 2
    # the same path as the auto run (an unknown hook keeps rows whole, no shared prefixes), at a fixed size of 2
    fixed = evaluate(model, task, hooks=[memory_limit(100, [])], batch_size=2, progress=False)
    assert [it.logprobs for it in auto.items] == [it.logprobs for it in fixed.items]

    # a zeroing that counts what it saw forgets the failed attempts
    zeroing, direct = random_zeroing(model, 0.5, seed=2), random_zeroing(model, 0.5, seed=2)
    evaluate(model, task, hooks=[zeroing, memory_limit(3, [])], batch_size="auto", progress=False)
    evaluate(model, task, hooks=[direct, memory_limit(100, [])], batch_size=2, progress=False)  # the same path
    assert torch.equal(zeroing.zeroed(), direct.zeroed())


def test_auto_batch_in_the_scoring_pass_and_what_is_not_out_of_memory(tiny_text_model):
    model = tiny_text_model
    texts = [f"The number {i} is {'odd' if i % 2 else 'even'} and that is all." for i in range(6)]
    tried = []
    runtime_oom = lambda: RuntimeError("CUDA error: out of memory")  # noqa: E731 (older torch's form)
    auto = score_heads(model, texts, hooks=[memory_limit(2, tried, runtime_oom)], batch_size="auto", progress=False)
    assert tried[:2] == [6, 4] and auto.meta["batch_size"] == 2  # 6 texts: 8 per batch, then 4, then 2
    torch.testing.assert_close(auto.values, score_heads(model, texts, batch_size=2, progress=False).values,
                               rtol=0, atol=0)  # the same batches of 2: the same sums, bit for bit
    with pytest.raises(ValueError, match="not memory"):  # other errors are not retried
        score_heads(model, texts, hooks=[memory_limit(0, [], lambda: ValueError("not memory"))], batch_size="auto",
                    progress=False)
    with pytest.raises(torch.OutOfMemoryError):  # even one row does not fit
        score_heads(model, texts, hooks=[memory_limit(0, [])], batch_size="auto", progress=False)
    for bad in ("big", 0, 2.5):
        with pytest.raises(ValueError, match="'auto'"):
            score_heads(model, texts, batch_size=bad, progress=False)


@pytest.mark.floats
def test_bfloat16_model_is_scored_in_float32_from_its_activations(tiny_text_model):
    model = tiny_model("llama", seed=0, n_layers=2, dtype=torch.bfloat16)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 12))
    scores = score_heads(model, tokens, progress=False)
    assert scores.values.dtype == torch.float32
    # the scoring pass runs the attention fused (SDPA), whose bfloat16 rounding is not the eager attention's: the
    # reference reads hook_z from the same forward, so the comparison is of the reductions alone
    with torch.no_grad(), fused_attention(model):
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_z"))
    ahon = SCORE_NAMES.index("AHON")
    for layer in range(model.cfg.n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"]  # [batch, pos, head, d_head] in bfloat16
        assert z.dtype == torch.bfloat16
        by_hand = z.float().norm(dim=-1).mean(1)  # mean over positions of |o_i|, in float32
        in_bf16 = z.norm(dim=-1).mean(1).float()  # what a bfloat16 reduction would give
        torch.testing.assert_close(scores.values[:, layer, :, ahon], by_hand, rtol=1e-5, atol=1e-6)
        assert (in_bf16 - by_hand).abs().max() > 1e-4  # so the check above tells the two apart


@pytest.mark.parametrize("text", ["0", "-2", "x", "1.5", ""])
def test_a_batch_size_written_as_text_is_a_whole_number_or_auto(text):
    assert batching.parse_batch_size(" auto ") == "auto" and batching.parse_batch_size("12") == 12
    with pytest.raises(InputError, match="batch_size must be a whole number >= 1 or 'auto'"):
        batching.parse_batch_size(text)
