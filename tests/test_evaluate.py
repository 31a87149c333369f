"""The evaluator: batched scoring equals a one-forward-per-choice loop; hooks reach the forward; the statistics."""

import math

import numpy as np
import pytest
import torch

from conftest import LOGLIK_TOL, text_model
from lens_heads.ablation.hooks import static_zeroing, threshold_zeroing, zero_heads
from lens_heads.data.items import Item, Task
from lens_heads.data.rows import within_context
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.results import EvalResult, ItemRecord, paired_difference, wilson_interval
from lens_heads.plumbing.errors import InputError


def loop_logprobs(model, item, fwd_hooks=(), protocol="lm-eval"):
    """Reference: one forward per choice over the whole context + continuation, summing the continuation tokens'
    log-probabilities. ``"tl"``: TransformerLens's own to_tokens (context with BOS, then the continuation without);
    ``"lm-eval"``: lm-eval 0.4.5's encoding, written out with the tokenizer (no BOS; the continuation is what
    encoding context + continuation adds after the context's tokens)."""
    out = []
    with torch.no_grad():
        for context, continuation in zip(item.contexts, item.continuations):
            stripped = context.rstrip()  # lm-eval: trailing whitespace belongs to the continuation
            continuation = context[len(stripped):] + continuation
            if protocol == "tl":
                ctx = model.to_tokens(stripped, prepend_bos=True)[0]
                cont = model.to_tokens(continuation, prepend_bos=False)[0]
            else:
                whole = model.tokenizer.encode(stripped + continuation, add_special_tokens=False)
                ctx = torch.tensor(model.tokenizer.encode(stripped, add_special_tokens=False))
                cont = torch.tensor(whole[len(ctx):])
            logits = model.run_with_hooks(torch.cat([ctx, cont])[None], fwd_hooks=list(fwd_hooks))
            logp = torch.log_softmax(logits[0].double(), dim=-1)
            out.append(sum(logp[len(ctx) - 1 + k, t].item() for k, t in enumerate(cont.tolist())))
    return out


@pytest.mark.parametrize("protocol", ["lm-eval", "tl"])
@pytest.mark.parametrize("name,kwargs,n", [("arc_easy", {"split": "validation"}, 4), ("mmlu", {"shots": 0}, 3), ("piqa", {}, 3),
                                           ("winogrande", {}, 3), ("hellaswag", {}, 1)])
def test_batched_evaluator_matches_a_per_choice_loop_on_the_embedded_model(smollm, name, kwargs, n, protocol):
    task = load_task(name, n=n, seed=1, **kwargs)
    result = evaluate(smollm, task, batch_size=3, progress=False, protocol=protocol)
    assert result.n == n and result.chance == pytest.approx(task.chance) and result.meta["protocol"] == protocol
    for item, record in zip(task, result.items):
        expected = loop_logprobs(smollm, item, protocol=protocol)
        # 30 float32 layers on other paths (batches, fused attention, packed weights): seen up to 1.4e-4 apart at
        # -43 and 4.2e-5 at -7.3 (one MMLU letter: its logits' rounding, ~20 in size); as tests/bridge_agreement.py's
        # BRIDGE bound for another implementation
        np.testing.assert_allclose(record.logprobs, expected, atol=1e-4, rtol=3e-5)
        gap = np.sort(expected)[-1] - np.sort(expected)[-2]
        if gap > 1e-2:  # choices agree wherever the reference is not a near-tie
            assert record.chosen() == int(np.argmax(expected))
        assert record.gold == item.gold


def test_letter_format_runs_one_forward_row_per_question(smollm):
    task = load_task("mmlu", n=3, shots=0, seed=2)
    result = evaluate(smollm, task, batch_size=8, progress=False)
    assert result.meta["rows"] == len(task)
    # lm-eval: the context alone (the letter is never input), no BOS
    prompt_tokens = sum(len(smollm.tokenizer.encode(item.prompt.rstrip(), add_special_tokens=False)) for item in task)
    assert result.meta["row_tokens"] == prompt_tokens  # the four letters are read, not run
    # the questions' common beginning (the description's first words) runs once: fewer tokens than the rows'
    assert result.meta["shared_prefix"] == "any" and result.meta["forward_tokens"] < prompt_tokens
    tl = evaluate(smollm, task, batch_size=8, progress=False, protocol="tl")
    assert tl.meta["row_tokens"] == sum(smollm.to_tokens(item.prompt).shape[1] for item in task)
    assert result.meta["padded_tokens"] <= result.meta["forward_tokens"] / 0.75  # padding stays bounded


@pytest.fixture(scope="module")
def tiny_text_model():
    return text_model()


@pytest.mark.floats
def test_user_hooks_and_zeroings_reach_every_forward(tiny_text_model):
    model = tiny_text_model
    task = load_task("arc_easy", split="validation", n=4, seed=3)
    calls = []
    heads = [(0, 1), (1, 2)]
    recorder = ("blocks.0.attn.hook_z", lambda z, hook: calls.append(z.shape[0]))
    pairs = evaluate(model, task, hooks=zero_heads(heads) + [recorder], batch_size=4, progress=False)
    zeroing = static_zeroing(model, heads)
    wrapped = evaluate(model, task, hooks=[zeroing], batch_size=2, progress=False)
    plain = evaluate(model, task, batch_size=4, progress=False)
    assert sum(calls) == pairs.meta["rows"]  # the user's hook saw every row
    for a, b, item in zip(pairs.items, wrapped.items, task):  # other batches, another forward: float32 rounding
        np.testing.assert_allclose(a.logprobs, b.logprobs, **LOGLIK_TOL)
        np.testing.assert_allclose(a.logprobs, loop_logprobs(model, item, zero_heads(heads)), **LOGLIK_TOL)
    assert any(not np.allclose(a.logprobs, b.logprobs, atol=1e-3) for a, b in zip(pairs.items, plain.items))
    assert zeroing.share_zeroed() == pytest.approx(len(heads) / (model.cfg.n_layers * model.cfg.n_heads))


@pytest.mark.floats
def test_hook_sets_share_the_forward_below_them_and_each_equals_its_own_forward(tiny_text_model):
    """evaluate_each runs the unhooked trunk once per batch and each set from its first hooked block: every set's
    log-likelihoods must equal one plain forward per choice under that set alone (padded batches, sets at the
    first, a middle and the last block, one after the blocks and one before them)."""
    from lens_heads.evaluation.evaluate import evaluate_each

    model = tiny_text_model
    task = load_task("arc_easy", split="validation", n=4, seed=5)
    last = model.cfg.n_layers - 1
    def scale(x, hook):
        return 0.5 * x
    sets = [zero_heads([(1, 0)]), zero_heads([(0, 2)]), zero_heads([(last, 1), (1, 1)]), [],
            [("ln_final.hook_normalized", scale)], [("hook_embed", scale)]]
    results = evaluate_each(model, task, sets, batch_size=3, progress=False)
    assert results[0].meta["padded_tokens"] > results[0].meta["forward_tokens"]
    for hooks, result in zip(sets, results):
        for record, item in zip(result.items, task):
            np.testing.assert_allclose(record.logprobs, loop_logprobs(model, item, hooks), **LOGLIK_TOL)
    # the hook_embed set keeps every set on the row path; the first set alone, row by row: the same operations on
    # the same batches
    alone = evaluate_each(model, task, [sets[0]], batch_size=3, progress=False, _shared_prefixes=False)[0]
    assert results[0].meta["shared_prefix"] is None
    for a, b in zip(results[0].items, alone.items):
        assert a.logprobs == b.logprobs


@pytest.mark.floats
def test_threshold_zeroing_in_the_evaluator_sees_each_batch_mask(tiny_text_model):
    """Padding must not change what the per-input mode decides: batch sizes 1 (no padding) and 3 agree."""
    model = tiny_text_model
    task = load_task("piqa", n=3, seed=4)
    results = []
    for batch_size in (1, 3):
        zeroing = threshold_zeroing(model, "AHON (LN)", 1.0)
        result = evaluate(model, task, hooks=[zeroing], batch_size=batch_size, progress=False)
        results.append((result, zeroing.zeroed().sum().item(), zeroing.share_zeroed()))
    (a, count_a, share_a), (b, count_b, share_b) = results
    assert b.meta["padded_tokens"] > b.meta["forward_tokens"]  # the batched run did pad
    assert count_a == count_b > 0 and share_a == pytest.approx(share_b)
    for x, y in zip(a.items, b.items):
        np.testing.assert_allclose(x.logprobs, y.logprobs, **LOGLIK_TOL)


def test_items_longer_than_the_context_are_refused_or_dropped(tiny_text_model):
    """A toy context of 128 tokens: the evaluator refuses rows that don't fit and says what to do; within_context
    keeps exactly the items whose every choice fits (counted here with TransformerLens's own tokenizer calls)."""
    model = tiny_text_model
    task = load_task("piqa", n=40, seed=5)

    def longest_row(item):  # lm-eval rows: the whole text's tokens without the last one, no BOS
        return max(len(model.tokenizer.encode(c + x, add_special_tokens=False)) - 1
                   for c, x in zip(item.contexts, item.continuations))

    fits = [longest_row(item) <= model.cfg.n_ctx for item in task]
    assert 0 < sum(fits) < len(task)  # the sample has both kinds
    with pytest.raises(ValueError, match="within_context"):
        evaluate(model, task, progress=False)
    kept, dropped = within_context(model, task)
    assert [item.id for item in kept] == [item.id for item, ok in zip(task, fits) if ok]
    assert dropped == len(task) - sum(fits) and kept.name == task.name
    assert evaluate(model, kept, progress=False).n == len(kept)


def _record(id, gold, logprobs, n_tokens=None, subject=None):
    n_tokens = n_tokens or [1] * len(logprobs)
    return ItemRecord(id=id, gold=gold, logprobs=logprobs, n_tokens=n_tokens, n_chars=[2 * t for t in n_tokens],
                      subject=subject)


def test_length_normalisation_and_subject_weighting_on_hand_made_records():
    items = [
        _record("a", 0, [-4.0, -3.0], n_tokens=[4, 1], subject="x"),  # sum picks 1, per token picks 0 (-1 vs -3)
        _record("b", 1, [-2.0, -1.0], subject="x"),
        _record("c", 0, [-1.0, -2.0], subject="y"),
        _record("d", 0, [-3.0, -1.0], subject="z"),
    ]
    result = EvalResult(task="mmlu", format="cloze", items=items, chance=0.5)
    assert result.accuracy == pytest.approx(2 / 4)  # b, c
    assert result.accuracy_by("per_token") == pytest.approx(3 / 4)  # a, b, c
    assert result.subject_accuracy() == {"x": 0.5, "y": 1.0, "z": 0.0}
    assert result.macro_accuracy == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    frame = result.to_dataframe()
    assert list(frame["chosen"]) == [1, 1, 0, 1] and list(frame["gold_logprob"]) == [-4.0, -1.0, -1.0, -3.0]


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (57, 100), (200, 200)])
def test_wilson_interval_endpoints_solve_the_score_equation(k, n):
    z = 1.959963984540054
    low, high = wilson_interval(k, n)
    p_hat = k / n
    for p in (low, high):  # an endpoint p satisfies |p_hat - p| = z sqrt(p (1 - p) / n), unless clipped at 0 or 1
        if 0 < p < 1:
            assert abs(p_hat - p) == pytest.approx(z * math.sqrt(p * (1 - p) / n), abs=1e-9)
    assert low <= p_hat <= high


def test_paired_difference_and_companion_metrics_by_hand():
    base = EvalResult("t", "cloze", [_record("a", 0, [-1.0, -2.0]), _record("b", 1, [-1.0, -3.0]),
                                     _record("c", 0, [-0.5, -2.5])], chance=0.5)
    ablated = EvalResult("t", "cloze", [_record("c", 0, [-3.0, -2.0]), _record("a", 0, [-2.5, -2.0]),
                                        _record("b", 1, [-2.0, -1.0])], chance=0.5)
    diff = paired_difference(ablated, base)
    correct_delta = np.array([0 - 1, 0 - 1, 1 - 0.0])  # c, a, b: paired by id
    assert diff.mean == pytest.approx(correct_delta.mean())
    half = 1.959963984540054 * correct_delta.std(ddof=1) / math.sqrt(3)
    assert diff.ci95 == pytest.approx((correct_delta.mean() - half, correct_delta.mean() + half))
    assert diff.gold_logprob_change.mean == pytest.approx(np.mean([-3.0 - -0.5, -2.5 - -1.0, -1.0 - -3.0]))

    def softmax(x):
        e = np.exp(np.array(x) - max(x))
        return e / e.sum()

    kls = [sum(p * math.log(p / q) for p, q in zip(softmax(b), softmax(a)))
           for b, a in [([-1.0, -2.0], [-2.5, -2.0]), ([-1.0, -3.0], [-2.0, -1.0]), ([-0.5, -2.5], [-3.0, -2.0])]]
    assert diff.kl.mean == pytest.approx(np.mean(kls))
    with pytest.raises(ValueError, match="same items"):
        paired_difference(EvalResult("t", "cloze", base.items[:2], chance=0.5), base)


def test_round_trip_through_a_dict():
    result = EvalResult("t", "cloze", [_record("a", 1, [-1.0, -0.5], subject="s")], chance=0.5, meta={"k": 1})
    again = EvalResult.from_dict(result.to_dict())
    assert again.items == result.items and again.accuracy == result.accuracy and again.meta == {"k": 1}


def test_bad_input_is_explained(tiny_text_model):
    task = Task(name="t", split="s", shots=0, format="cloze", n_total=1, seed=0,
                items=[Item(id="x", contexts=("word " * 80,) * 2, continuations=(" a", " b"), gold=0)])
    with pytest.raises(ValueError, match="context of 128 tokens"):
        evaluate(tiny_text_model, task, progress=False)
    with pytest.raises(InputError, match="hook_name"):
        evaluate(tiny_text_model, task, hooks=["blocks.0.attn.hook_z"], progress=False)
    with pytest.raises(InputError, match="or None, got 3"):
        evaluate(tiny_text_model, task, hooks=3, progress=False)


@pytest.mark.floats
def test_hooks_none_means_no_hooks(tiny_text_model):
    task = load_task("arc_easy", split="validation", n=2, seed=3)
    result = evaluate(tiny_text_model, task, hooks=None, progress=False)
    assert result.meta["hooks"] == []
    for record, item in zip(result.items, task):  # batched against one forward per choice: float32 rounding
        np.testing.assert_allclose(record.logprobs, loop_logprobs(tiny_text_model, item), **LOGLIK_TOL)


def _plain_forward_reads(model, items):
    """For every (item, choice): the log-probs and argmax-hits of its continuation tokens, read from the full logits
    of a plain ``model(tokens)`` over the evaluator's rows (one row at a time, no padding), and the smallest gap
    between the two largest logits at those positions (an argmax that float32 rounding could flip has none)."""
    from lens_heads.data.rows import build_rows

    out = {}
    with torch.no_grad():
        for row in build_rows(model, items):
            logits = model(torch.tensor([row.tokens]))[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            for choice, first, ids in row.reads:
                positions = range(first, first + len(ids))
                top2 = logits[list(positions)].topk(2, dim=-1).values
                out[row.item, choice] = ([logp[p, t].item() for p, t in zip(positions, ids)],
                                         [int(logits[p].argmax()) == t for p, t in zip(positions, ids)],
                                         float((top2[:, 0] - top2[:, 1]).min()))
    return out


@pytest.mark.floats
def test_single_continuation_accuracy_is_greedy_match_and_bits_per_byte_by_hand(tiny_text_model):
    """LAMBADA-style items (one continuation): correct = every continuation token is the argmax of a plain
    forward's logits; bits per byte = -sum log2 p / UTF-8 bytes (the "é" and "’" make bytes differ from chars)."""
    from lens_heads.data.rows import build_rows

    model = tiny_text_model
    contexts = ["The cat sat on the", "She opened the door and", "Once upon a time there was", "He said that",
                "In the morning we", "It was a dark and stormy", "The best thing about", "They went to the"]
    items = []
    for k, context in enumerate(contexts):  # continuation = the model's own argmax after the context, if it decodes
        probe = Item(id="probe", contexts=(context,), continuations=(" the",), gold=0)
        (row,) = build_rows(model, [probe])
        _, first, _ = row.reads[0]
        with torch.no_grad():
            top = int(model(torch.tensor([row.tokens[:first + 1]]))[0, -1].argmax())
        candidate = Item(id=f"g{k}", contexts=(context,), continuations=(model.tokenizer.decode([top]),), gold=0)
        if build_rows(model, [candidate])[0].reads[0][2] == [top]:
            items.append(candidate)
    assert items, "no context's argmax token survives a decode/encode round trip"
    items += [Item(id="café", contexts=("We met at the",), continuations=(" café’s terrace",), gold=0),
              Item(id="x", contexts=("Numbers:",), continuations=(" one two three",), gold=0)]
    task = Task(name="lambada-like", split="s", shots=0, format="greedy", n_total=len(items), seed=0, items=items)
    result = evaluate(model, task, batch_size=3, progress=False)
    reads = _plain_forward_reads(model, items)
    # no argmax is within rounding of a tie: the logits (a few in size) are rounded by ~1e-6 of that (conftest)
    assert min(reads[i, 0][2] for i in range(len(items))) > 1e-4
    expected_correct = [all(reads[i, 0][1]) for i in range(len(items))]
    assert [it.correct() for it in result.items] == expected_correct
    assert any(expected_correct) and not all(expected_correct)
    assert result.accuracy == pytest.approx(np.mean(expected_correct)) and task.chance == result.chance == 0.0
    bpb = [-sum(reads[i, 0][0]) / math.log(2) / len(it.continuations[0].encode("utf-8")) for i, it in enumerate(items)]
    assert len(" café’s terrace".encode("utf-8")) == len(" café’s terrace") + 3
    # the evaluator's float32 log-likelihoods against a plain forward's: LOGLIK_TOL, which exp turns from an
    # absolute error of the mean log-likelihood (under 1e-4 here) into a relative one of the perplexity
    assert result.bits_per_byte == pytest.approx(np.mean(bpb), rel=LOGLIK_TOL["rtol"], abs=LOGLIK_TOL["atol"])
    assert result.perplexity == pytest.approx(math.exp(-np.mean([sum(reads[i, 0][0]) for i in range(len(items))])),
                                              rel=1e-4)
    assert result.summary()["bits_per_byte"] == pytest.approx(result.bits_per_byte)


def test_token_ids_outside_the_vocabulary_and_unknown_hooks_are_named(tiny_text_model):
    from lens_heads.heads.scoring import score_heads
    from lens_heads.models.loading import tiny_model

    small = tiny_model("llama", seed=0, d_vocab=97, tokenizer=tiny_text_model.tokenizer)  # 1,024-token tokenizer
    task = Task(name="t", split="s", shots=0, format="cloze", n_total=1, seed=0,
                items=[Item(id="q7", contexts=("The sky is",) * 2, continuations=(" blue", " green"), gold=0)])
    ids = tiny_text_model.tokenizer("The sky is blue", add_special_tokens=False)["input_ids"]
    assert max(ids) >= 97  # so the check has something to find
    with pytest.raises(ValueError, match=r"outside the model's vocabulary of 97 \(0 to 96\): item q7: "):
        evaluate(small, task, progress=False)
    tokens = torch.tensor([[1, 2, 3], [4, 500, -1]])
    with pytest.raises(ValueError, match=r"vocabulary of 97 .*: input 1: -1, 500\."):
        score_heads(small, tokens, progress=False)

    noop = lambda x, hook=None: None  # noqa: E731
    with pytest.raises(ValueError, match=r"no hook 'blocks\.9\.attn\.hook_z'.*'blocks\.0\.attn\.hook_z'"):
        evaluate(tiny_text_model, task, hooks=[("blocks.9.attn.hook_z", noop)], progress=False)
    with pytest.raises(ValueError, match=r"no hook 'blocks\.0\.attn\.hook_zz' \(did you mean 'blocks\.0\.attn\.hook_z'"):
        score_heads(tiny_text_model, tokens[:1], hooks=[("blocks.0.attn.hook_zz", noop)], progress=False)


def test_acc_norm_divides_by_the_choice_without_its_leading_space():
    """lm-eval's acc_norm: argmax of log-likelihood / len(choice), where the choice is the document's answer text
    (the request's continuation is the target delimiter " " + choice). Checked on raw ARC-Easy and HellaSwag
    documents: the answer texts, and HellaSwag's endings cleaned as lm-eval's process_docs does."""
    import re

    from datasets import load_from_disk

    from lens_heads.data.benchmark_files import asset_root

    def clean(text):  # lm-eval hellaswag/utils.py preprocess
        return re.sub("\\[.*?\\]", "", text.strip().replace(" [title]", ". ")).replace("  ", " ")

    model = text_model(n_layers=1, n_ctx=512)
    root = asset_root() / "hf_datasets"
    arc = {d["id"]: d["choices"]["text"] for d in load_from_disk(str(root / "ai2_arc/ARC-Easy/validation")).to_list()}
    swag = load_from_disk(str(root / "hellaswag/none/validation")).to_list()
    for task, choices in ((load_task("arc_easy", split="validation", n=6, seed=2), lambda i: arc[i.split("/")[1]]),
                          (load_task("hellaswag", n=4, seed=1),
                           lambda i: [clean(e) for e in next(d for d in swag if f"hellaswag/{d['ind']}" == i)["endings"]])):
        result = evaluate(model, task, progress=False)
        by_hand = []
        for record in result.items:
            lengths = [len(c) for c in choices(record.id)]
            assert record.n_chars == lengths
            by_hand.append(int(np.argmax(np.asarray(record.logprobs) / lengths)) == record.gold)
        assert result.accuracy_by("per_char") == pytest.approx(np.mean(by_hand))
        assert "without the continuation's leading space" in result.meta["acc_norm"]
