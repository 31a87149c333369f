"""Every family of the paper (Llama-3, Qwen2.5, OLMo-2), and Qwen3, Mistral, Gemma-2, Gemma-3 and GPT-2, loaded from a
tiny random Hugging Face folder with ``load_model(folder)`` on each backend and checked against plain Hugging Face
eager attention (``families.py``): the twelve scores, the per-input threshold zeroing, greedy generation under a
static zeroing (one prompt, and a padded batch against a key/value cache).

Each environment has one backend: ``.venv`` HookedTransformer (TransformerLens 3.9), ``.venv-bridge``
TransformerBridge (4.x); ``.ci/run`` runs this file in both, and the other backend's cases skip with that reason.
"""

import json

import pytest
import torch

from families import (
    FAMILIES,
    INPUTS,
    PAD,
    REFUSED,
    build_folder,
    hf_forward,
    hf_greedy,
    hf_threshold_zeroing,
    load_hf,
    reference_scores,
)
from lens_heads import load_model, score_heads, static_zeroing, threshold_zeroing, zero_heads
from lens_heads.data.inputs import right_pad
from lens_heads.evaluation.generate import generate
from lens_heads.evaluation.generate_batch import generate_batch
from lens_heads.models.backends import default_backend, tl_version
from report_run import run_cli

HERE = default_backend()


def _here(backend: str):
    where = ".venv-bridge" if backend == "bridge" else ".venv"
    return pytest.mark.skipif(backend != HERE, reason=f"backend {backend!r} is not installed here (TransformerLens "
                                                      f"{tl_version()}): {where} runs it")


def _case(family: str, backend: str):
    return pytest.param(family, backend, id=f"{family}-{backend}", marks=_here(backend))


CASES = [_case(family, backend) for family in FAMILIES for backend in ("hooked", "bridge")
         if (family, backend) not in REFUSED]


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    """``get(family, backend)``: the family's folder loaded with lens_heads and in plain Hugging Face (built once)."""
    loaded: dict = {}

    def get(family: str, backend: str):
        if (family, backend) not in loaded:
            folder = build_folder(family, tmp_path_factory.mktemp(family))
            loaded[family, backend] = (load_model(str(folder), backend=backend, device="cpu"), load_hf(folder))
        return loaded[family, backend]

    return get


# The layers HookedTransformer runs as causal attention, global or within a sliding window, which lens_heads runs
# fused: their scores read the pattern by query chunks from the queries and keys (a window's chunks against its
# windows only). The others (soft-caps, OLMo's full-vector q/k norms) run TransformerLens's attention, whose pattern
# the scores read by rows.
FUSED_LAYERS = {"llama-3": [0, 1], "qwen2.5": [0, 1], "qwen3": [0, 1], "gpt-2": [0, 1], "mistral": [0, 1],
                "gemma-3": [0, 1], "gemma-3-linear-rope": [0, 1]}


# the fused layers' rows from one fused attention's log-sum-exp (the CPU's), or by chunks of rows as on other devices;
# chunks of 3 rows: every input (7-11 tokens) in several chunks
@pytest.mark.parametrize("rows, query_chunk", [("fused", 256), ("chunks", 256), ("chunks", 3)])
@pytest.mark.parametrize("family, backend", CASES)
def test_twelve_scores_match_plain_hugging_face(family, backend, rows, query_chunk, family_models, attention_calls,
                                                monkeypatch):
    from lens_heads.heads import attention_rows

    if rows == "chunks":
        monkeypatch.setattr(attention_rows, "fused_statistics_apply", lambda source: False)
    model, hf = family_models(family, backend)
    assert model.lens_heads_meta["backend"] == backend
    got = score_heads(model, INPUTS, batch_size=4, progress=False, query_chunk=query_chunk)  # one padded batch
    if backend == "hooked":
        assert attention_calls == {"fused": FUSED_LAYERS.get(family, []), "eager": []}
    for i, ids in enumerate(INPUTS):
        _, acts = hf_forward(hf, ids)
        for layer, a in enumerate(acts):
            # the captured parts are consistent: z = A v with the query -> key/value head map of the reference
            torch.testing.assert_close(torch.einsum("hqk,khd->qhd", a["pattern"], a["v"]), a["z"])
            want = reference_scores(**a)
            for k, name in enumerate(got.names):
                # float32 forward against a float64 one (seen: < 1e-6 relative); no absolute floor
                torch.testing.assert_close(got.values[i, layer, :, k].double(), want[name], rtol=1e-5, atol=0,
                                           msg=lambda m, i=i, layer=layer, name=name: f"{name}, input {i}, layer "
                                                                                      f"{layer}: {m}")


def _threshold(hf, name: str) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
    """A threshold zeroing some but not all heads, no score (unablated, or on the zeroed stream) within 1e-4
    relative of it, so the float32 forward (< 1e-6 from the float64 one) can't flip a decision; and the plain
    Hugging Face decisions [input, layer, head] and logits at it."""
    values = torch.cat([reference_scores(**a)[name] for ids in INPUTS for a in hf_forward(hf, ids)[1]]).sort().values
    for share in (0.3, 0.25, 0.35, 0.2, 0.4):  # of heads zeroed (before the zeroing moves the later layers' scores)
        k = int((1 - share if name == "AWFT" else share) * len(values))
        threshold = float(values[k - 1] + values[k]) / 2
        runs = [hf_threshold_zeroing(hf, ids, name, threshold) for ids in INPUTS]
        zeroed = torch.stack([r[0] for r in runs])
        if min(r[2] for r in runs) > 1e-4 and 0 < zeroed.float().mean() < 1:
            return threshold, zeroed, [r[1] for r in runs]
    raise AssertionError(f"no threshold of {name} keeps 1e-4 from every score: change the inputs")


@pytest.mark.parametrize("family, backend", CASES)
def test_threshold_zeroing_decides_as_plain_hugging_face(family, backend, family_models):
    """The same (input, layer, head) zeroed as in plain Hugging Face, where each layer is decided on the stream
    zeroed in the layers before, and the same logits after; AWFT read 3 query rows at a time, fused where it can."""
    model, hf = family_models(family, backend)
    tokens, mask = right_pad(INPUTS, PAD)
    for name in ("AWFT", "AVVN", "AHON (LN)"):  # reads the pattern, the values, the head outputs
        threshold, want, want_logits = _threshold(hf, name)
        ablation = threshold_zeroing(model, name, threshold, query_chunk=3)
        with torch.no_grad(), model.hooks(fwd_hooks=ablation.hooks), ablation.batch(mask, first=0):
            logits = model(tokens, attention_mask=mask.long())
        assert torch.equal(ablation.zeroed(), want), (name, ablation.zeroed(), want)
        for i, ids in enumerate(INPUTS):
            # float32 against float64 logits of size ~1-10: 1e-4 absorbs the rounding of two layers (seen: ~1e-6)
            torch.testing.assert_close(logits[i, :len(ids)].double(), want_logits[i], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family, backend", CASES)
def test_greedy_generation_under_static_zeroing_matches_plain_hugging_face(family, backend, family_models):
    model, hf = family_models(family, backend)
    heads = [(0, 1), (1, 2), (1, 3)]
    zero = {layer: torch.tensor([(layer, h) in heads for h in range(4)]) for layer in (0, 1)}
    prompt, n = INPUTS[1], 8
    want, gap = hf_greedy(hf, prompt, zero, n)
    assert gap > 1e-3  # a float32 argmax can't differ from the float64 one by rounding
    assert want != hf_greedy(hf, prompt, {}, n)[0]  # the zeroing changes the continuation
    for cache in (False, True):  # the whole sequence rerun at each step, and the key/value-cached step
        made = generate(model, prompt, hooks=zero_heads(heads), max_new_tokens=n, stop=(), cache=cache)
        eos = model.tokenizer.eos_token_id
        assert made.tokens == want[:len(made.tokens)], (cache, made.tokens, want)
        assert (made.stop, len(made.tokens)) == ("max_new_tokens", n) or \
            (made.stop == "eos" and want[len(made.tokens)] == eos), (cache, made, want)


@pytest.mark.parametrize("family, backend", CASES)
def test_batched_generation_against_a_key_value_cache_equals_each_input_alone(family, backend, family_models):
    """The inputs (of different lengths, longer than the sliding windows) left-padded into one batch and generated
    against a key/value cache under a static zeroing: token for token what each gives alone, its whole sequence
    rerun at every step. The bridge keeps no cache for a batch: it reruns."""
    model, _ = family_models(family, backend)
    hooks = [static_zeroing(model, [(0, 1), (1, 2), (1, 3)])]
    made = generate_batch(model, INPUTS, hooks=hooks, max_new_tokens=[8] * len(INPUTS), stops=[[]] * len(INPUTS))
    want = [generate(model, ids, hooks=hooks, max_new_tokens=8, stop=(), input_id=i) for i, ids in enumerate(INPUTS)]
    assert [(g.tokens, g.stop) for g in made] == [(g.tokens, g.stop) for g in want]
    assert all(g.cached is (backend == "hooked") for g in made)


@pytest.mark.parametrize("family, backend", [_case(*key) for key in REFUSED])
def test_a_configuration_the_backend_cannot_convert_is_refused_by_name(family, backend, tmp_path):
    error, words = REFUSED[family, backend]
    with pytest.raises(error, match=words):
        load_model(str(build_folder(family, tmp_path / family)), backend=backend, device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param(b, marks=_here(b)) for b in ("hooked", "bridge")])
def test_report_quick_runs_end_to_end_on_a_tiny_qwen_folder(backend, tmp_path):
    """``python -m lens_heads.report FOLDER --quick`` on a tiny Qwen2.5 folder (the embedded model's tokenizer, so
    the tasks' text means something): every stage of the preset runs, the model card is the folder's, and the
    example prompt's scores are those of plain Hugging Face."""
    from transformers import AutoTokenizer

    from lens_heads.models.embedded import embedded_model_folder

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_folder())
    folder = build_folder("qwen2.5", tmp_path / "qwen", config=dict(max_position_embeddings=1024), tokenizer=tokenizer)
    out = tmp_path / "report"
    run = run_cli([str(folder), "--quick", "--backend", backend, "--no-progress", "--no-png", "--out", str(out)])
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert {name: stage["status"] for name, stage in results["stages"].items()} == {
        "load_model": "done", "scores:arc_easy": "done", "ablation:arc_easy": "done", "effects:arc_easy": "skipped",
        "rank": "done", "layers": "skipped", "attention": "done", "explorer": "done", "total": "done"}
    hf = load_hf(folder)
    card = results["model"]
    c = hf.config
    assert card["backend"] == backend and (card["n_layers"], card["n_heads"], card["n_kv_heads"], card["d_model"]) == (
        c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.hidden_size)
    prompt = results["attention"]["prompts"][0]
    ids = tokenizer.encode(prompt["text"], add_special_tokens=False)
    shown = prompt["tokens"]
    ids = [tokenizer.bos_token_id] + ids if len(shown) == len(ids) + 1 else ids  # as the backend prepends a BOS
    assert [tokenizer.decode([i]) for i in ids] == shown
    _, acts = hf_forward(hf, ids)
    score = results["attention"]["score"]
    for head in prompt["heads"]:
        want = reference_scores(**acts[head["layer"]])[score][head["head"]]
        assert head["prompt_score"] == pytest.approx(float(want), rel=1e-5)  # float32 against float64
