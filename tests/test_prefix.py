"""Shared prefixes computed once: the same log-likelihoods, hook values and counts as the row-by-row path, on fewer
forward tokens, and the row path kept wherever a hook decides from the whole row."""

import contextlib
import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import LOGLIK_TOL, assert_close_to_scale, text_model
from lens_heads.ablation.hooks import mean_z, static_zeroing, threshold_zeroing, zero_heads
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.data.items import Item, Task
from lens_heads.data.rows import Row, build_rows, within_context
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.prefix import (
    FORWARD_COST,
    MAX_BATCH_ROWS,
    Extension,
    PrefixState,
    mark,
    plan_groups,
    token_batches,
)

TASKS = [("arc_easy", {"split": "validation"}), ("piqa", {}), ("winogrande", {"shots": 0}), ("hellaswag", {})]


@pytest.fixture(scope="module")
def model():
    return text_model(n_ctx=256)


def ablations(model, kind, task=None):
    """Each ablation kind the shared-prefix path takes, built fresh (HeadAblation objects count what they see)."""
    if kind == "none":
        return []
    if kind == "static":
        return [static_zeroing(model, [(0, 1), (1, 2), (1, 3)])]
    if kind == "random":
        return [random_zeroing(model, 0.4, seed=3)]
    if kind == "mean":
        return [static_zeroing(model, [(0, 0), (1, 1)], ablation="mean", means=mean_z(model, task))]
    return zero_heads([(1, 2)])  # one head zeroed everywhere, as head_effects does


def both_paths(model, task, make, batch_size=3):
    """The evaluation with shared prefixes and the row-by-row one, each under freshly built hooks."""
    shared_hooks, row_hooks = make(), make()
    shared = evaluate_each(model, task, [shared_hooks], batch_size=batch_size, progress=False)[0]
    row = evaluate_each(model, task, [row_hooks], batch_size=batch_size, progress=False, _shared_prefixes=False)[0]
    return shared, row, shared_hooks, row_hooks


def assert_same_logprobs(a, b):
    for x, y in zip(a.items, b.items):
        np.testing.assert_allclose(x.logprobs, y.logprobs, **LOGLIK_TOL)  # other matmul shapes: float32 rounding
        assert x.greedy == y.greedy and x.n_tokens == y.n_tokens


@pytest.mark.floats
@pytest.mark.parametrize("kind", ["none", "static", "random", "mean", "zero_heads"])
@pytest.mark.parametrize("name,kwargs", TASKS)
def test_shared_prefixes_give_the_row_by_row_log_likelihoods(model, name, kwargs, kind):
    task, _ = within_context(model, load_task(name, n=5, seed=2, **kwargs))
    shared, row, shared_hooks, row_hooks = both_paths(model, task, lambda: ablations(model, kind, task))
    assert shared.meta["shared_prefix"] == ("item" if kind == "random" else "any") and row.meta["shared_prefix"] is None
    assert shared.meta["forward_tokens"] < row.meta["forward_tokens"] == row.meta["row_tokens"]
    assert shared.meta["padded_tokens"] > shared.meta["forward_tokens"]  # some batch was padded
    assert_same_logprobs(shared, row)
    if kind in ("static", "random", "mean"):  # the prefix passes are not counted: the same rows, the same heads
        a, b = shared_hooks[0], row_hooks[0]
        assert a.share_zeroed() == pytest.approx(b.share_zeroed())
        assert a.zeroed_by_input() == b.zeroed_by_input() and len(a.zeroed()) == len(b.zeroed())


def mmlu_like(shots=5, questions=7, subjects=2):
    """Letter-format items whose contexts begin with a subject's description and few-shot block."""
    items = []
    for s in range(subjects):
        block = f"The following are questions about subject {s}.\n\n" + "".join(
            f"Question {k} of {s}: what is {k} + {s}?\nA. {k}\nB. {k + s}\nC. 0\nD. 1\nAnswer: B\n\n"
            for k in range(shots))
        for q in range(questions):
            context = block + f"Question: which is {q} times {s + q}?\nA. {q}\nB. {s}\nC. {q * (s + q)}\nD. 2\nAnswer:"
            items.append(Item(id=f"{s}-{q}", contexts=(context,) * 4, continuations=(" A", " B", " C", " D"),
                              gold=2, subject=f"s{s}"))
    return Task(name="mmlu-like", split="test", shots=shots, format="letter", items=items, n_total=len(items),
                seed=0)


@pytest.mark.floats
@pytest.mark.parametrize("kind", ["none", "static", "mean", "zero_heads"])
def test_a_few_shot_block_is_computed_once_across_the_questions_of_a_subject(kind):
    model = text_model(n_ctx=512)
    task = mmlu_like()
    shared, row, _, _ = both_paths(model, task, lambda: ablations(model, kind, task), batch_size=4)
    assert shared.meta["rows"] == len(task)  # MMLU: one row per question, shared with the other questions
    assert shared.meta["forward_tokens"] < 0.5 * row.meta["forward_tokens"]
    assert_same_logprobs(shared, row)


def common_beginning(rows) -> int:
    """How many tokens all ``rows`` begin with, ending before the first read position of any (counted here, apart
    from the planner)."""
    n = min(first for r in rows for _, first, _ in r.reads)
    for i in range(n):
        if len({r.tokens[i] for r in rows}) > 1:
            return i
    return n


@pytest.mark.floats
def test_a_subject_split_into_several_groups_runs_its_block_once():
    """More questions than a group holds (4 x batch size rows): the parts share the subject's whole common
    beginning and run it once, so the forward tokens are the rows' tokens less every other question's block."""
    model = text_model(n_ctx=512)
    task = mmlu_like(questions=11)
    rows = build_rows(model, task)
    blocks = [common_beginning([r for r in rows if task.items[r.item].subject == s]) for s in ("s0", "s1")]
    shared, row, _, _ = both_paths(model, task, lambda: [], batch_size=2)  # groups of at most 8 rows
    assert shared.meta["forward_tokens"] == row.meta["row_tokens"] - sum((11 - 1) * b for b in blocks)
    assert_same_logprobs(shared, row)


@pytest.mark.floats
def test_mmlu_five_shot_rows_share_their_subject_block(model):
    """The real MMLU 5-shot rows (a subject's questions) share the five shots; random zeroing draws per item, so
    questions share nothing and the row path runs."""
    long_model = text_model(n_ctx=1024)
    task = load_task("mmlu", n=None, seed=0)
    subject = task.items[0].subject
    task = replace(task, items=[it for it in task.items if it.subject == subject][:6])
    shared, row, _, _ = both_paths(long_model, task, lambda: [])
    assert shared.meta["forward_tokens"] < 0.6 * row.meta["forward_tokens"]
    assert_same_logprobs(shared, row)
    drawn = evaluate(long_model, task, hooks=[random_zeroing(long_model, 0.3)], progress=False)
    assert drawn.meta["shared_prefix"] is None


@pytest.mark.floats
def test_several_hook_sets_share_the_trunk_and_the_prefixes(model):
    task = load_task("arc_easy", split="validation", n=5, seed=4)
    def make():
        return [zero_heads([(1, 0)]), zero_heads([(0, 2)]), [], [static_zeroing(model, [(1, 3)])],
                        zero_heads([(1, 1), (0, 0)])]
    shared = evaluate_each(model, task, make(), batch_size=3, progress=False)
    rows = evaluate_each(model, task, make(), batch_size=2, progress=False, _shared_prefixes=False)
    for result, row in zip(shared, rows, strict=True):
        assert result.meta["shared_prefix"] == "any" and result.meta["forward_tokens"] < row.meta["forward_tokens"]
        assert_same_logprobs(result, row)


class LastZ:
    """Records ``hook_z`` of a layer at each counted row's last real position, per input (a batch-aware object that
    declares its action the same on every row)."""

    prefix_scope = "any"

    def __init__(self, layer: int):
        self.seen: dict[int, list[torch.Tensor]] = {}
        self.hooks = [(f"blocks.{layer}.attn.hook_z", self.hook)]
        self.mask = self.inputs = None
        self.counting = True

    @contextlib.contextmanager
    def batch(self, mask, inputs, count=True):
        self.mask, self.inputs, self.counting = mask, inputs, count
        yield
        self.counting = True

    def hook(self, z, hook=None):
        if self.counting:
            last = self.mask.sum(1) - 1
            for b, item in enumerate(self.inputs):
                self.seen.setdefault(item, []).append(z[b, last[b]].clone())


@pytest.mark.floats
def test_a_hook_on_hook_z_sees_the_row_by_row_values_at_its_positions(model):
    task = load_task("arc_easy", split="validation", n=4, seed=6)
    shared, row = LastZ(1), LastZ(1)
    a = evaluate_each(model, task, [[zero_heads([(0, 3)])[0], shared]], batch_size=3, progress=False)[0]
    evaluate_each(model, task, [[zero_heads([(0, 3)])[0], row]], batch_size=3, progress=False,
                  _shared_prefixes=False)
    assert a.meta["shared_prefix"] == "any"
    for item, values in row.seen.items():
        def ordered(xs):
            return sorted(xs, key=lambda x: float(x.detach().sum()))
        for x, y in zip(ordered(shared.seen[item]), ordered(values), strict=True):
            assert_close_to_scale(x, y)


@pytest.mark.floats
def test_fused_attention_with_a_recorded_prefix_equals_the_whole_rows(model):
    """Two rows cut after different prefix lengths: the suffix forward against the recorded prefixes gives the
    whole rows' hook_z and residual stream at the suffix positions (rotary positions continue the prefix)."""
    gen = torch.Generator().manual_seed(0)
    whole = torch.randint(0, 500, (2, 20), generator=gen)
    cut = [7, 12]
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, expected = model.run_with_cache(whole, names_filter=lambda n: n in names or n.endswith("resid_post"))
        state = PrefixState()
        prefix_tokens = torch.stack([torch.cat([whole[b, :cut[b]], torch.zeros(12 - cut[b], dtype=torch.long)])
                                     for b in range(2)])
        prefix_mask = (torch.arange(12)[None] < torch.tensor(cut)[:, None]).long()
        kv: dict = {}
        with fused_attention(model, prefix=state), state.recording(kv):
            model(prefix_tokens, attention_mask=prefix_mask)
        suffix = torch.stack([torch.cat([whole[b, cut[b]:], torch.zeros(cut[b] - 7, dtype=torch.long)])
                              for b in range(2)])
        suffix_mask = (torch.arange(13)[None] < torch.tensor([13, 8])[:, None]).long()
        extension = Extension(kv, torch.tensor([0, 1]), torch.tensor(cut))
        with fused_attention(model, prefix=state), state.extending(extension):
            _, got = model.run_with_cache(suffix, attention_mask=suffix_mask,
                                          names_filter=lambda n: n in names or n.endswith("resid_post"))
    for name in names + [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]:
        for b in range(2):
            n_real = 20 - cut[b]
            assert_close_to_scale(got[name][b, :n_real], expected[name][b, cut[b]:], msg=name)


def test_threshold_zeroing_and_unknown_hooks_keep_the_row_path(model):
    task = load_task("piqa", n=3, seed=4)
    zeroing = threshold_zeroing(model, "AHON (LN)", 1.0)
    result = evaluate(model, task, hooks=[zeroing], batch_size=3, progress=False)
    assert result.meta["shared_prefix"] is None and result.meta["forward_tokens"] == result.meta["row_tokens"]
    assert 0.1 < zeroing.share_zeroed() < 0.9  # the zeroing decides, row by row
    # independent reference: each row alone (no batch, no padding, no shared prefix), the zeroing deciding on that
    # row only, its continuation's log-probabilities summed by hand from the logits
    expected: dict[tuple[int, int], float] = {}
    for row in build_rows(model, list(task)):
        alone = threshold_zeroing(model, "AHON (LN)", 1.0)
        with torch.no_grad():
            logits = model.run_with_hooks(torch.tensor([row.tokens]), fwd_hooks=alone.hooks)
        logp = torch.log_softmax(logits[0].double(), -1)
        for choice, start, continuation in row.reads:
            expected[row.item, choice] = sum(float(logp[start + k, t]) for k, t in enumerate(continuation))
    for i, it in enumerate(result.items):
        # a row batched with others sums in another order than the row alone: float32 rounding of the forward
        np.testing.assert_allclose(it.logprobs, [expected[i, c] for c in range(len(it.logprobs))], **LOGLIK_TOL)
    user = evaluate(model, task, hooks=[("blocks.0.attn.hook_z", lambda z, hook: z)], progress=False)
    assert user.meta["shared_prefix"] is None
    marked = evaluate(model, task, hooks=[("blocks.0.attn.hook_z", mark(lambda z, hook: z, "any"))], progress=False)
    assert marked.meta["shared_prefix"] == "any"
    eager = evaluate(model, task, attention="eager", progress=False)
    assert eager.meta["shared_prefix"] is None


def test_groups_end_before_the_first_read_and_random_zeroing_groups_within_an_item():
    rows = [Row(0, [1, 2, 3, 4, 5, 6, 7], [(0, 6, [8])]), Row(0, [1, 2, 3, 4, 5, 9], [(1, 4, [9, 10])]),
            Row(1, [1, 2, 3, 4, 5, 6, 9], [(0, 6, [3])]), Row(2, [4, 4, 4], [(0, 2, [1])])]
    groups = plan_groups(rows, "any", max_rows=8)
    shared = [g for g in groups if g.prefix]
    assert len(shared) == 1 and shared[0].prefix == [1, 2, 3, 4] and len(shared[0].rows) == 3
    assert sorted(r.reads[0][1] for r in shared[0].rows) == [0, 2, 2]  # read positions moved into the suffix
    by_item = plan_groups(rows, "item", max_rows=8)
    assert all(len({r.item for r in g.rows}) == 1 for g in by_item)
    assert [len(g.prefix) for g in by_item if g.prefix] == [4]
    split = plan_groups(rows[:3], "any", max_rows=2)  # a group larger than max_rows is split, its prefix kept
    assert [len(g.rows) for g in split] == [2, 1] and [g.prefix for g in split] == [[1, 2, 3, 4]] * 2


def test_embedded_model_arc_easy_under_static_zeroing(smollm):
    """One case on SmolLM2 (30 layers, 9 query / 3 KV heads). Its summed log-likelihoods reach ~50 in size, where
    float32 rounding moves the row path itself by 1.7e-5 between batch sizes 1 and 8 (ARC-Easy, 16 items): the
    tolerance is 1e-5 plus 5e-6 of the value (4e-5 measured here at -27.4)."""
    task = load_task("arc_easy", split="validation", n=4, seed=7)
    heads = [(0, 1), (5, 3), (17, 8), (29, 0)]
    shared, row, _, _ = both_paths(smollm, task, lambda: [static_zeroing(smollm, heads)])
    assert shared.meta["shared_prefix"] == "any" and shared.meta["forward_tokens"] < 0.6 * row.meta["forward_tokens"]
    for x, y in zip(shared.items, row.items):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5, rtol=5e-6)


def cheapest_cut(lengths, budget):
    """By enumeration: the least padded tokens + FORWARD_COST per forward over every cut of the sorted lengths into
    consecutive batches within ``budget`` (a single row may exceed it)."""
    best = None
    for cuts in itertools.product([False, True], repeat=len(lengths) - 1):
        starts = [0] + [k + 1 for k, c in enumerate(cuts) if c] + [len(lengths)]
        batches = [lengths[a:b] for a, b in zip(starts, starts[1:])]
        if all(len(b) == 1 or len(b) * b[0] <= budget for b in batches):
            cost = sum(len(b) * b[0] + FORWARD_COST for b in batches)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_token_batches_cut_with_the_least_padding_and_forwards(seed):
    rng = np.random.default_rng(seed)
    lengths = sorted(rng.integers(1, 60, size=11).tolist(), reverse=True)
    budget = int(rng.integers(40, 200))
    rows = [Row(k, [7] * n, []) for k, n in enumerate(lengths)]
    batches = token_batches(rows, budget)
    assert [r.item for b in batches for r in b] == list(range(len(rows)))  # every row once, in order
    assert all(len(b) == 1 or len(b) * len(b[0].tokens) <= budget for b in batches)
    assert sum(len(b) * len(b[0].tokens) + FORWARD_COST for b in batches) == cheapest_cut(lengths, budget)


def test_token_batches_hold_at_most_max_batch_rows():
    rows = [Row(k, [7], []) for k in range(2 * MAX_BATCH_ROWS + 5)]
    batches = token_batches(rows, budget=10**6)
    assert max(len(b) for b in batches) <= MAX_BATCH_ROWS and len(batches) == 3  # no padding: the fewest forwards


def float64_model(model):
    """A float64 copy of ``model`` (weights, rotary tables and config), for exactness beyond float32 rounding."""
    return model.to(torch.float64, print_details=False)


POSITIONS = {"rotary": dict(arch="llama"), "learned": dict(arch="gpt2"),
             "shortformer": dict(arch="gpt2", positional_embedding_type="shortformer")}


# every ablation kind on each task with rotary positions; learned ones on a zero-shot and a few-shot task; the
# shortformer's (the same lookup, added to queries and keys only) unhooked and under per-item random zeroing
EXACT_CASES = [(name, kind, positions) for positions, names, kinds in [
    ("rotary", ("arc_easy", "hellaswag", "mmlu-like"), ("none", "static", "random", "mean", "zero_heads")),
    ("learned", ("arc_easy", "mmlu-like"), ("none", "static", "random", "mean", "zero_heads")),
    ("shortformer", ("arc_easy",), ("none", "random"))]
    for name in names for kind in kinds if (name, kind) != ("mmlu-like", "random")]  # drawn per question: no sharing


@pytest.mark.floats
@pytest.mark.parametrize("name,kind,positions", EXACT_CASES)
def test_in_float64_shared_prefixes_equal_the_eager_row_path_to_1e_10(name, kind, positions):
    """The algorithm is exact: in float64 the shared path (fused attention, packed weights, prefix keys/values,
    padded prefix and suffix batches) gives the log-likelihoods of TransformerLens's own eager attention run row by
    row, to 1e-10, for every ablation kind it takes, with rotary positions (llama) or learned ones (GPT-2's, and
    the shortformer's, added to queries and keys only) continuing the prefix. (In float32 the two differ by
    matmul-shape rounding.)"""
    model = float64_model(text_model(n_ctx=512, **POSITIONS[positions]))
    task = mmlu_like(questions=4) if name == "mmlu-like" else within_context(model, load_task(name, n=4, seed=3))[0]
    def make():
        return ablations(model, kind, task)
    shared = evaluate_each(model, task, [make()], batch_size=3, progress=False)[0]
    eager = evaluate_each(model, task, [make()], batch_size=3, progress=False, attention="eager",
                          _shared_prefixes=False)[0]
    assert shared.meta["shared_prefix"] is not None and eager.meta["shared_prefix"] is None
    assert shared.meta["padded_tokens"] > shared.meta["forward_tokens"]
    assert all(np.isfinite(x.logprobs).all() for x in shared.items)
    for x, y in zip(shared.items, eager.items, strict=True):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-10, rtol=0)
        assert x.greedy == y.greedy


@pytest.mark.slow
def test_in_float64_the_embedded_model_under_static_zeroing_agrees_to_1e_10():
    """SmolLM2 (30 layers, 9 query / 3 KV heads) in float64 on ARC-Easy: shared prefixes against the eager row path."""
    from lens_heads.models.loading import load_model

    model = float64_model(load_model())
    task = load_task("arc_easy", n=3, seed=7)
    def make():
        return [static_zeroing(model, [(0, 1), (5, 3), (17, 8), (29, 0)])]
    shared = evaluate_each(model, task, [make()], batch_size=4, progress=False)[0]
    eager = evaluate_each(model, task, [make()], batch_size=4, progress=False, attention="eager",
                          _shared_prefixes=False)[0]
    assert shared.meta["shared_prefix"] == "any"
    for x, y in zip(shared.items, eager.items, strict=True):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-10, rtol=0)


def test_learned_positions_continue_the_prefix_and_restore_an_enclosing_block():
    """Under an extension, GPT-2's position embedding is W_pos at each row's positions after its prefix (zero on
    padding); an inner block leaves the enclosing block's embedding in place, and the last one leaves the module's."""
    from lens_heads.evaluation.prefix import learned_positions

    model = text_model(arch="gpt2")
    tokens, mask = torch.zeros(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [1, 1, 0]])
    state = PrefixState()
    with learned_positions(model, state):
        outer = model.pos_embed.forward
        with learned_positions(model, PrefixState()):
            pass
        assert model.pos_embed.forward is outer
        with state.extending(Extension({}, torch.tensor([0, 1]), torch.tensor([5, 2]))):
            got = model.pos_embed(tokens, 0, mask)
    W = model.pos_embed.W_pos
    torch.testing.assert_close(got[0], W[5:8], rtol=0, atol=0)
    torch.testing.assert_close(got[1, :2], W[2:4], rtol=0, atol=0)
    assert not got[1, 2].any() and "forward" not in vars(model.pos_embed)
