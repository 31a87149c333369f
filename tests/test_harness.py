"""lens_heads inside lm-evaluation-harness (lens_heads/harness/), offline: lm-eval task YAMLs in tests/data/lm_eval read
local JSONL made from the installed benchmark data (tests/make_lm_eval_data.py).

Each ablation form run by lm-eval through ``LensHeadsLM`` is compared with ``lh.evaluate(model, task, hooks=...)`` on
the same items (its hooks built here from the public functions); ``load_task("lm_eval:...")`` with the requests lm-eval
builds and the rows lm-eval's own pair encoding gives; bad input through lm-eval's command line fails before any
forward; and (slow) lm-eval's own ``hf`` model on the embedded model's Hugging Face folder against ``lens_heads``."""

import ast
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import lens_heads as lh
from conftest import LOGLIK_TOL, ROOT, text_model
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.generate import generate
from lens_heads.plumbing.errors import InputError

lm_eval = pytest.importorskip("lm_eval", reason="the harness extra: pip install 'lens_heads[harness]'")
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.tasks import TaskManager, get_task_dict  # noqa: E402

from lens_heads.harness import LensHeadsLM  # noqa: E402

DATA = ROOT / "tests" / "data" / "lm_eval"
ARC, MMLU, GEN = (str(DATA / f"{name}.yaml") for name in ("arc_easy_local", "mmlu_local", "arc_easy_gen_local"))


@pytest.fixture(autouse=True)
def _repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the YAMLs' data_files are relative to the repository root


@pytest.fixture(scope="module")
def model():
    return text_model(n_ctx=1024)  # an MMLU 5-shot prompt is ~600 tiny-tokenizer tokens


@pytest.fixture(scope="module")
def manager():
    return TaskManager(include_path=str(DATA), include_defaults=False)  # the built-in tasks take ~40 s to index


def _docs(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]


def _run(lm, tasks, manager, **kwargs) -> dict:
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, log_samples=True,
                                   bootstrap_iters=0, **kwargs)


def _sample_logprobs(results: dict, task: str) -> tuple[list[list[float]], list[list[float | None]]]:
    """Per document (in order): its requests' log-likelihoods and the share zeroed lens_heads logged for each."""
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    lls = [[resp[0][0] for resp in s["resps"]] for s in samples]
    shares = [[args[-1]["lens_heads"]["share_zeroed"] for args in s["arguments"]] for s in samples]
    return lls, shares


# ---------------------------------------------------------------- lm-eval tasks as lens_heads tasks


class _PairEncoder(TemplateLM):
    """lm-eval's own context/continuation split (``TemplateLM._encode_pair``) over a tokenizer, nothing else."""

    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    def tok_encode(self, string, **kwargs):
        return self.tokenizer(string, add_special_tokens=False)["input_ids"]

    eot_token_id = property(lambda self: self.tokenizer.eos_token_id)
    _loglikelihood_tokens = loglikelihood_rolling = generate_until = None  # type: ignore[assignment]


@pytest.mark.parametrize("name", ["arc_easy_local", "mmlu_local", "arc_easy_gen_local"])
def test_load_task_rows_equal_the_rows_lm_eval_builds(name, model, manager):
    task = lh.load_task(f"lm_eval:{DATA / name}.yaml")
    theirs = get_task_dict([name], manager)[name]
    theirs.set_fewshot_seed(seed=1234)
    theirs.build_all_requests(rank=0, world_size=1)
    by_doc: dict[int, list] = {}
    for inst in theirs.instances:
        by_doc.setdefault(inst.doc_id, []).append(inst)
    assert len(task) == len(by_doc) == len(_docs("mmlu_test" if name == "mmlu_local" else "arc_easy"))
    encoder = _PairEncoder(model.tokenizer)
    rows = build_rows(model, task.items)
    for index, item in enumerate(task):
        requests = sorted(by_doc[index], key=lambda inst: inst.idx)
        if name == "arc_easy_gen_local":
            assert item.contexts == (requests[0].args[0],) and item.n_choices == 1
            continue
        assert list(zip(item.contexts, item.continuations)) == [inst.args for inst in requests]
        # each choice's forward row is lm-eval's: (context + continuation)[:-1], its tokens read after the context
        for row in [r for r in rows if r.item == index]:
            for choice, start, ids in row.reads:
                ctx, cont = encoder._encode_pair(*requests[choice].args)
                assert ids == cont and start == len(ctx) - 1
                assert row.tokens[:len(ctx)] == ctx
    gold = ([d["choices"]["label"].index(d["answerKey"]) for d in _docs("arc_easy")] if name == "arc_easy_local" else
            [d["answer"] for d in _docs("mmlu_test")] if name == "mmlu_local" else [0] * len(task))
    assert [it.gold for it in task] == gold
    if name == "mmlu_local":  # five shots of the dev split, lm-eval's first_n sampler
        assert task.shots == 5 and task.items[0].contexts[0].count("\nAnswer:") == 6


def test_load_task_samples_and_refuses_what_does_not_apply():
    task = lh.load_task(f"lm_eval:{ARC}", n=7, seed=3)
    everything = lh.load_task(f"lm_eval:{ARC}")
    assert len(task) == 7 and all(item in everything.items for item in task)
    with pytest.raises(InputError, match="split, format and fewshot_split do not apply"):
        lh.load_task(f"lm_eval:{ARC}", split="validation")
    with pytest.raises(InputError, match="no_such_task.yaml does not exist"):
        lh.load_task("lm_eval:no_such_task.yaml")


# ---------------------------------------------------------------- each ablation form against evaluate(hooks=)


def _hooks(model, form: str, task):
    """The hooks of each model_args form, built here from the public functions (calibrated on the task's rows)."""
    if form == "none":
        return None
    if form in ("threshold", "static"):
        scores = lh.score_heads(model, task, progress=False)
        if form == "threshold":
            return lh.threshold_zeroing(model, "AHON (LN)", lh.thresholds(scores, "AHON (LN)", [0.3])[0.3])
        mean = scores.mean("AHON (LN)")  # '<': the lowest means are the most inactive
        k = round(0.3 * mean.numel())
        order = torch.argsort(mean.flatten(), stable=True)[:k]
        return lh.static_zeroing(model, [(int(i) // mean.shape[1], int(i) % mean.shape[1]) for i in order])
    if form.startswith("random"):
        return lh.random_zeroing(model, 0.3, 5, draw=form.split(":")[1])
    if form == "heads":
        return lh.static_zeroing(model, [(0, 1), (1, 3)])
    return lh.remove_layers(model, [1], part=form.split(":")[1])


FORMS = {"none": {}, "threshold": dict(ablation="threshold:AHON (LN):0.3"),
         "static": dict(ablation="static:AHON (LN):0.3"), "random:per_row": dict(ablation="random:0.3:per_row:5"),
         "random:per_item": dict(ablation="random:0.3:per_item:5"), "heads": dict(heads="0.1;1.3"),
         "layers:attention": dict(layers="1"), "layers:block": dict(layers="1", layer_part="block")}


@pytest.mark.floats
@pytest.mark.parametrize("form", list(FORMS))
def test_each_ablation_form_equals_evaluate_with_its_hooks(form, model, manager):
    """Per item: the log-likelihood of every choice (the same evaluator on the same rows and batches: float
    rounding only, LOGLIK_TOL), the accuracy, and the share of heads zeroed that lm-eval's samples log."""
    results = _run(LensHeadsLM(pretrained=model, progress=False, **FORMS[form]), ["arc_easy_local"], manager)
    lls, shares = _sample_logprobs(results, "arc_easy_local")
    task = lh.load_task(f"lm_eval:{ARC}")
    hooks = _hooks(model, form, task)
    ours = lh.evaluate(model, task, hooks=[hooks] if hooks is not None else (), progress=False)
    np.testing.assert_allclose(np.concatenate(lls), np.concatenate([r.logprobs for r in ours.items]), **LOGLIK_TOL)
    assert results["results"]["arc_easy_local"]["acc,none"] == pytest.approx(ours.accuracy, abs=1e-12)
    if hooks is None:
        expected = [0.0] * len(task)
    elif form.startswith("layers"):
        expected = [1 / model.cfg.n_layers] * len(task)
    else:
        counted = hooks.zeroed_by_input()
        expected = [counted[i][1] / (counted[i][0] * model.cfg.n_layers * model.cfg.n_heads) for i in range(len(task))]
    assert [s[0] for s in shares] == pytest.approx(expected) and all(len(set(s)) == 1 for s in shares)
    info = results["config"]["lens_heads"]
    assert info["ablation"] == {"none": "none"}.get(form, info["ablation"]) and info["ablation_args"]["form"] in (
        None, form.split(":")[0])
    rows = [counted[i][0] for i in range(len(task))] if hooks is not None and not form.startswith("layers") else None
    if rows:
        assert info["share_zeroed"] == pytest.approx(np.dot(expected, rows) / sum(rows))


@pytest.mark.floats
def test_mmlu_five_shot_static_zeroing_equals_evaluate(model, manager):
    """The subject's shared five shots (computed once under a static zeroing) give the same choices' log-likelihoods."""
    results = _run(LensHeadsLM(pretrained=model, progress=False, heads="0.0;1.2"), ["mmlu_local"], manager)
    lls, _ = _sample_logprobs(results, "mmlu_local")
    task = lh.load_task(f"lm_eval:{MMLU}")
    ours = lh.evaluate(model, task, hooks=lh.static_zeroing(model, [(0, 0), (1, 2)]), progress=False)
    assert ours.meta["shared_prefix"]
    np.testing.assert_allclose(np.concatenate(lls), np.concatenate([r.logprobs for r in ours.items]), **LOGLIK_TOL)
    call = results["config"]["lens_heads"]["calls"][0]  # what ran: every row's tokens, fewer through the shared shots
    assert call["row_tokens"] == sum(len(r.tokens) for r in build_rows(model, task)) > call["forward_tokens"]
    assert call["padded_tokens"] >= call["forward_tokens"]


def test_a_later_call_reuses_the_layouts_and_lays_out_a_changed_weight_again(manager):
    """The LM keeps the evaluator's weight layouts between calls; one weight changed in place between two calls is
    laid out again (and only it), so the second call scores the model as it now is."""
    model = text_model(n_ctx=1024)
    lm = LensHeadsLM(pretrained=model, progress=False)
    first, _ = _sample_logprobs(_run(lm, ["arc_easy_local"], manager), "arc_easy_local")
    made = {key: held.value for key, held in lm._layouts.items()}
    with torch.no_grad():
        model.blocks[0].mlp.W_in.mul_(2.0)
    second, _ = _sample_logprobs(_run(lm, ["arc_easy_local"], manager), "arc_easy_local")
    assert made.keys() == lm._layouts.keys() and len(made) > 1
    assert [key for key, held in lm._layouts.items() if held.value is not made[key]] == [
        (id(model.blocks[0].mlp), "gated")]
    fresh = lh.evaluate(model, lh.load_task(f"lm_eval:{ARC}"), progress=False)
    np.testing.assert_allclose(np.concatenate(second), np.concatenate([r.logprobs for r in fresh.items]), **LOGLIK_TOL)
    assert np.abs(np.concatenate(first) - np.concatenate(second)).max() > 1e-3  # the change mattered


@pytest.mark.parametrize("ablation", ["random:0.3:per_item:2", "threshold:AHON (LN):0.3"])
def test_generate_until_is_lens_heads_generation_under_the_hooks(ablation, model, manager):
    results = _run(LensHeadsLM(pretrained=model, progress=False, ablation=ablation), ["arc_easy_gen_local"], manager,
                   limit=6)
    samples = sorted(results["samples"]["arc_easy_gen_local"], key=lambda s: s["doc_id"])
    prompts = [s["arguments"][0][0] for s in samples]
    if ablation.startswith("random"):
        hooks = lh.random_zeroing(model, 0.3, 2)
    else:  # calibrated on the prompts, the rows a generation reads first
        scores = lh.score_heads(model, prompts, progress=False)
        hooks = lh.threshold_zeroing(model, "AHON (LN)", lh.thresholds(scores, "AHON (LN)", [0.3])[0.3])
    texts = [generate(model, p, hooks=[hooks], max_new_tokens=8, stop=["\n", "Question:"], input_id=i).text
             for i, p in enumerate(prompts)]
    assert [s["resps"][0][0] for s in samples] == texts


def test_loglikelihood_rolling_is_the_text_after_the_prefix_token(model):
    from lm_eval.api.instance import Instance

    texts = ["The sun rose over the quiet harbour.", "Two plus two is four."]
    requests = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    got = LensHeadsLM(pretrained=model, progress=False).loglikelihood_rolling(requests)
    for text, value in zip(texts, got):  # a plain forward: log-softmax of the logits after [prefix] + tokens
        ids = [model.tokenizer.bos_token_id] + model.tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids[:-1]])).double().log_softmax(-1)[0]
        expected = float(logits[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_rendering_is_lm_eval_hfs(add_generation_prompt, model):
    """--apply_chat_template: the messages rendered as lm-eval's own hf model renders them (its method, run here)."""
    from types import SimpleNamespace

    from lm_eval.models.huggingface import HFLM

    history = [{"role": "system", "content": "About geography."}, {"role": "user", "content": "Q1?"},
               {"role": "assistant", "content": "A"}, {"role": "user", "content": "Q2?"}]
    if not add_generation_prompt:
        history.append({"role": "assistant", "content": "B"})
    hf = SimpleNamespace(tokenizer=model.tokenizer, chat_template_args={})
    ours = LensHeadsLM(pretrained=model, progress=False).apply_chat_template(history, add_generation_prompt)
    assert ours == HFLM.apply_chat_template(hf, history, add_generation_prompt) and "<|im_start|>" in ours


# ---------------------------------------------------------------- bad input through lm-eval's command line


def _cli(monkeypatch, model, model_args: str, task: str = "arc_easy_local") -> None:
    """``python -m lens_heads.harness --model lens_heads --model_args ...`` in this process, the model load replaced by
    the tiny model whose first block refuses to run (so the error must come before any forward)."""
    import lens_heads.harness.lm as lm_module
    from lens_heads.harness.__main__ import main

    def no_forward(*args):
        raise AssertionError("a forward ran before the error")

    handle = model.blocks[0].register_forward_pre_hook(no_forward)
    monkeypatch.setattr(lm_module, "load_model", lambda *args, **kwargs: model)
    init = TaskManager.__init__  # the command line indexes lm-eval's built-in tasks too (~40 s): only ours here
    monkeypatch.setattr(TaskManager, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "include_defaults": False}))
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "lens_heads", "--model_args", model_args, "--tasks", task,
                                      "--include_path", str(DATA), "--batch_size", "4"])
    try:
        main()
    finally:
        handle.remove()


@pytest.mark.parametrize("model_args, message", [
    ("ablation=zero:AHON (LN):0.1", r"unknown ablation form 'zero'; the forms are threshold:SCORE:SHARE, "
                                    r"static:SCORE:SHARE, random:SHARE"),
    ("ablation=threshold:AHON (LN):1.5", r"share 1.5 is outside \[0, 1\)"),
    ("ablation=random:10", r"share 10 is outside \[0, 1\)"),
    ("ablation=static:AHON (LN):-0.1", r"share -0.1 is outside \[0, 1\)"),
    ("ablation=threshold:NOPE:0.1", "unknown score 'NOPE'"),
    ("heads=1.2;7.0", r"head \(7, 0\) is outside the model's 2 layers x 4 heads"),
    ("layers=1;5", r"layer\(s\) \[5\] out of range"),
    ("layer_part=mlp,layers=1", "layer_part must be one of attention|block"),
    ("ablation=random:0.1,heads=1.1", "give one of ablation=, heads= and layers="),
    ("ablations=random:0.1", r"unknown key\(s\) \['ablations'\]"),
])
def test_bad_model_args_are_refused_before_any_forward(model_args, message, model, monkeypatch):
    with pytest.raises(InputError, match=message):
        _cli(monkeypatch, model, model_args)


def test_a_thresholds_file_for_another_model_is_refused(model, monkeypatch, tmp_path):
    path = tmp_path / "thresholds.json"
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    path.write_text(json.dumps({"mmlu": {"meta-llama_Llama-3.2-3B": {"HONOR": values}}}))
    with pytest.raises(InputError, match="has no model .*thresholds of another model do not carry over"):
        _cli(monkeypatch, model, f"ablation=threshold:AHON (LN):0.1,thresholds={path}")


def test_a_request_longer_than_the_context_is_refused(monkeypatch):
    short = text_model()  # 128 tokens: an MMLU 5-shot prompt does not fit
    with pytest.raises(InputError, match="longer than the model's context of 128 tokens"):
        _cli(monkeypatch, short, "ablation=threshold:AHON (LN):0.1", task="mmlu_local")
    # a generation prompt too long keeps its last tokens, as lm-eval's hf does (tests/test_harness_generate.py); a
    # max_gen_toks that fills the context alone is refused
    with pytest.raises(InputError, match="leaves no room for a prompt in the model's context of 8 tokens"):
        _cli(monkeypatch, text_model(n_ctx=8), "ablation=random:0.1", task="arc_easy_gen_local")


def test_the_thresholds_file_gives_the_threshold(model, manager, tmp_path):
    """thresholds=PATH zeroes at the file's threshold for the share: as threshold_zeroing at that value."""
    from lens_heads.heads.thresholds_file import model_key

    path = tmp_path / "thresholds.json"
    values = [0.0, 0.5, 0.9, 1.0, 1.1, 1.2, 1.3]  # at shares 0, .05, .1, ...
    path.write_text(json.dumps({"arc": {model_key(model): {"HONOR": values}}}))
    results = _run(LensHeadsLM(pretrained=model, progress=False, ablation="threshold:AHON (LN):0.1",
                               thresholds=str(path)), ["arc_easy_local"], manager, limit=5)
    lls, _ = _sample_logprobs(results, "arc_easy_local")
    task = lh.load_task(f"lm_eval:{ARC}")
    task.items = task.items[:5]
    ours = lh.evaluate(model, task, hooks=lh.threshold_zeroing(model, "AHON (LN)", 0.9), progress=False)
    np.testing.assert_allclose(np.concatenate(lls), np.concatenate([r.logprobs for r in ours.items]), **LOGLIK_TOL)
    assert results["config"]["lens_heads"]["calls"][0]["threshold"] == 0.9


def test_the_report_takes_lm_eval_tasks():
    from lens_heads.report.config import task_names

    assert task_names(f"arc_easy,lm_eval:{ARC}") == ("arc_easy", f"lm_eval:{ARC}")
    with pytest.raises(Exception, match="or lm_eval:TASK"):
        task_names("lm_evil:x")


# ---------------------------------------------------------------- packaging


def test_nothing_outside_the_harness_imports_lm_eval():
    for path in (ROOT / "lens_heads").glob("*/*.py"):
        if path.parent.name == "harness":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] == "lm_eval"], path


def test_the_extra_and_the_entry_point_are_declared():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["harness"] == [f"lm_eval=={lm_eval.__version__}"]
    module, name = project["entry-points"]["lm_eval.models"]["lens_heads"].split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is LensHeadsLM
    from lm_eval.api.registry import get_model

    assert get_model("lens_heads") is LensHeadsLM
    assert get_model("hf").__name__ == "HFLM"  # registering ours keeps lm-eval's own models


# ---------------------------------------------------------------- lm-eval's hf model against lens_heads (slow)


@pytest.mark.slow
@pytest.mark.floats
def test_lm_eval_hf_and_lens_heads_agree_on_the_embedded_model(smollm, manager):
    """Same tasks, same documents, lm-eval's own ``hf`` model on the embedded model's Hugging Face folder: every
    request's log-likelihood within 1e-3 (two float32 implementations, 30 layers: HookedTransformer against Hugging
    Face's Llama, the bound analyses/lm_eval_agreement.py states), every accuracy equal."""
    from lens_heads.models.embedded import embedded_model_folder

    tasks = ["arc_easy_local", "mmlu_local"]
    ours = _run(LensHeadsLM(pretrained=smollm, progress=False, batch_size=8), tasks, manager)
    theirs = lm_eval.simple_evaluate(model="hf", model_args=dict(pretrained=str(embedded_model_folder()),
                                                                 device="cpu", dtype="float32"),
                                     tasks=tasks, task_manager=manager, log_samples=True, bootstrap_iters=0,
                                     batch_size=8)
    for task in tasks:
        a, _ = _sample_logprobs(ours, task)
        b = [[resp[0][0] for resp in s["resps"]] for s in sorted(theirs["samples"][task], key=lambda s: s["doc_id"])]
        np.testing.assert_allclose(np.concatenate(a), np.concatenate(b), rtol=0, atol=1e-3)
        assert ours["results"][task]["acc,none"] == theirs["results"][task]["acc,none"]
    assert Path(embedded_model_folder()).is_dir()
