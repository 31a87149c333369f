"""The report command end to end (the ``--quick`` sizes on the embedded model, every stage run) and its building
blocks.

Numbers in results.json are checked against the library run again here, independently of the report's own
pipeline: the scores of the task sample and of the example prompt, the heads picked as most/least active, the
rank profile and the baseline accuracy. Bad arguments and unreachable models must end with one line and no
traceback.
"""

import contextlib
import json
import re
import shutil
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import tiny_tokenizer
from lens_heads.report.__main__ import main
from lens_heads.report.config import ALL_SCORES, QUICK, ReportConfig
from lens_heads.report.render import Section, Table, Text, render_page
from lens_heads.viz.attention import pick_heads, script_safe
from report_run import COMPARE_WITH, MARKUP_PROMPT, QUICK_ARGS, N, quick_report, run_cli

TASK = "arc_easy"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return quick_report(tmp_path_factory)


@pytest.fixture(scope="module")
def results(run):
    assert run.returncode == 0, run.stderr[-3000:]
    return run.results


# ---------------------------------------------------------------- the folder


def test_cli_succeeds_and_names_the_report(run):
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == f"{run.out}/report.html"
    assert "Traceback" not in run.stderr


def test_output_folder_contents(run, results):
    names = {p.name for p in run.out.iterdir()}
    expected = {"report.html", "results.json", "model_card.csv", f"head_scores_{TASK}.csv",
                f"layer_distributions_{TASK}.csv", f"thresholds_{TASK}.csv", "rank_profile.csv",
                "attention_heads.csv", f"score_heatmaps_{TASK}.png", f"score_distributions_{TASK}.png",
                "rank_profile.png", "cache", f"ablation_{TASK}.csv", f"ablation_summary_{TASK}.csv",
                f"ablation_{TASK}.png", f"effects_{TASK}.csv", f"effects_agreement_{TASK}.csv",
                f"effects_scatter_{TASK}.png", "compare_ranks.png"}
    assert expected <= names, expected - names
    assert set(results["files"]) <= names
    for png in run.out.glob("*.png"):
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png
    assert not list(run.out.glob("*.tmp")) and not list(run.out.glob(".*.tmp"))  # atomic writes left nothing behind


def test_results_say_what_they_are(results):
    s = results["settings"]
    assert s["model"] == "smollm2-135m" and s["quick"] is False and s["seed"] == 0
    assert s["n"] == N and list(s["fractions"]) == list(QUICK["fractions"])
    assert s["prompts"] == [MARKUP_PROMPT]
    assert results["weight_basis"].startswith("raw")
    data = results["data"][TASK]
    assert data["n"] == N and data["seed"] == 0 and data["split"] == "test"
    assert 0 < data["chance"] < 1
    for pkg in ("torch", "transformer_lens", "transformers", "plotly", "circuitsvis", "lens_heads"):
        assert results["versions"][pkg] != "not installed"
    stages = {f"{kind}:{TASK}" for kind in ("scores", "ablation", "effects")} | {"compare", "rank", "attention", "png"}
    assert stages <= set(results["stages"])
    assert all(v["status"] == "done" for v in results["stages"].values()), results["stages"]


def test_model_card_matches_the_model(results, smollm):
    m = results["model"]
    cfg = smollm.cfg
    assert (m["n_layers"], m["n_heads"], m["n_kv_heads"], m["d_model"]) == (cfg.n_layers, cfg.n_heads,
                                                                          cfg.n_key_value_heads, cfg.d_model)
    assert (m["n_layers"], m["n_heads"], m["n_kv_heads"]) == (30, 9, 3)
    # SmolLM2 ties its unembedding to the embedding (HF config), so that matrix counts once: 134.5M, not 163.0M
    # (and TransformerLens's zero biases, which the source lacks, not at all): the source's own count
    # (tests/test_param_count.py checks that count against Hugging Face's own)
    from lens_heads.models.loading import model_meta

    assert m["n_params"] == model_meta(smollm)["n_params"] < sum(p.numel() for p in smollm.parameters())


# ---------------------------------------------------------------- numbers agree with the library


@pytest.fixture(scope="module")
def task():
    from lens_heads import load_task

    return load_task(TASK, n=N, seed=0)


@pytest.fixture(scope="module")
def task_scores(smollm, task):
    from lens_heads.heads.scoring import score_heads

    return score_heads(smollm, task, batch_size=3, progress=False)  # another batch size: another padding layout


def test_mean_scores_match_a_fresh_scoring_pass(results, task_scores, run):
    r = results["scores"][TASK]
    # the scoring pass reads the evaluation's rows: one per choice of each cloze item
    assert r["names"] == list(ALL_SCORES) and r["n_inputs"] == len(task_scores) > N
    for i, name in enumerate(task_scores.names):
        fresh = task_scores.values[..., i].double().mean(0).numpy()
        np.testing.assert_allclose(np.array(r["mean_per_head"][name]), fresh, rtol=1e-4, atol=1e-5, err_msg=name)
    csv = pd.read_csv(run.out / f"head_scores_{TASK}.csv")
    row = csv[(csv["layer"] == 7) & (csv["head"] == 4)].iloc[0]
    assert row["AHON (LN)"] == pytest.approx(task_scores.values[:, 7, 4, 11].double().mean().item(), rel=1e-4)


def test_thresholds_match_the_library(results, task_scores):
    from lens_heads.heads.distributions import thresholds

    fractions = list(QUICK["fractions"])
    for name in ALL_SCORES:
        fresh = thresholds(task_scores, name, fractions)
        got = results["scores"][TASK]["thresholds"][name]
        assert [float(f) for f in got] == fractions
        np.testing.assert_allclose([got[f] for f in got], [fresh[f] for f in fractions], rtol=1e-4, atol=1e-6)


def test_attention_heads_and_prompt_scores_match_the_library(results, smollm, task_scores):
    from lens_heads.heads.scoring import score_heads

    a = results["attention"]
    assert a["score"] == "AHON (LN)" and a["direction"] == "<"
    mean = task_scores.score("AHON (LN)").double().mean(0).reshape(-1)
    k = a["k"]
    heads = a["prompts"][0]["heads"]
    most = {(h["layer"], h["head"]) for h in heads if h["role"] == "most active"}
    least = {(h["layer"], h["head"]) for h in heads if h["role"] == "least active"}
    H = smollm.cfg.n_heads
    assert most == {divmod(int(i), H) for i in torch.topk(mean, k).indices}
    assert least == {divmod(int(i), H) for i in torch.topk(-mean, k).indices}
    prompt = a["prompts"][0]
    assert prompt["text"] == MARKUP_PROMPT
    fresh = score_heads(smollm, [MARKUP_PROMPT], progress=False).score("AHON (LN)")[0]
    for h in heads:
        assert h["prompt_score"] == pytest.approx(fresh[h["layer"], h["head"]].item(), rel=1e-4, abs=1e-6)
    assert "".join(prompt["tokens"]).endswith(MARKUP_PROMPT)  # the tokens spell the prompt (after BOS)


def test_rank_profile_matches_the_library(results, smollm, task):
    from lens_heads.collapse.rank import attention_rank

    r = results["rank"]
    n = r["inputs"]["n"]
    assert n == QUICK["rank_n"]
    fresh = attention_rank(smollm, [item.prompt for item in task][:n], average=False, batch_size=5, progress=False)
    np.testing.assert_allclose(r["max_rank"], fresh.max_rank, atol=1e-6)
    np.testing.assert_allclose(r["mean_rank"], fresh.mean_rank, rtol=1e-6)
    assert r["lazy"] == fresh.lazy.tolist() and r["lazy_rule"] == fresh.lazy_rule


def test_ablation_baseline_matches_a_fresh_evaluation(results, smollm, task, run):
    from lens_heads.evaluation.evaluate import evaluate

    stage = results["stages"][f"ablation:{TASK}"]

    assert stage["status"] == "done", stage
    a = results["ablation"][TASK]
    base = evaluate(smollm, task, batch_size=4, progress=False)
    assert a["baseline"]["accuracy"] == pytest.approx(base.accuracy, abs=1e-9)
    assert a["chance"] == pytest.approx(task.chance)
    scores = set(QUICK["scores"])
    assert scores <= set(a["zeroable_within_1_point_pct"]) and scores <= set(a["normalised_auc_pct"])
    ranked = [a["normalised_auc_pct"][s] for s in a["auc_ranking"]]
    assert ranked == sorted(ranked, reverse=True)
    curves = pd.read_csv(run.out / f"ablation_{TASK}.csv")
    assert set(QUICK["scores"]) <= set(curves["score"])


def test_comparison_ranks_the_report_sweep_beside_the_recorded_one(results, run):
    assert results["stages"]["compare"]["status"] == "done", results["stages"]["compare"]
    c = results["compare"]
    assert [(d["model"], d["task"]) for d in c["inputs"]] == [("smollm2-135m", TASK), ("smollm2-135m", "piqa")]
    recorded = json.loads(open(COMPARE_WITH).read())
    assert c["inputs"][1]["n"] == recorded["task"]["n"] and c["inputs"][0]["n"] == N
    # by hand: the two sweeps share the shares 0 and 30% (quick: 0/15/30, recorded: 0/5/10/20/30), so each curve's
    # normalised AUC over that grid is the mean of its accuracy at the two points; ranked best first
    grid = sorted(set(QUICK["fractions"]) & {row["target_fraction"] for row in recorded["table"]})
    assert grid == [0.0, 0.3]
    tables = [pd.read_csv(run.out / f"ablation_{TASK}.csv"), pd.DataFrame(recorded["table"])]
    aucs = [{s: g[g["target_fraction"].isin(grid)]["accuracy"].mean()
             for s, g in t[t["mode"] != "static"].groupby("score", sort=False)} for t in tables]
    common = [s for s in results["ablation"][TASK]["normalised_auc_pct"] if s in aucs[1]]
    assert set(common) == set(QUICK["scores"]) | {"random"} and c["curves"] == common
    def rank(a, s):  # 1 = best, ties share the mean of the ranks they span
        v, others = round(a[s], 9), [round(a[x], 9) for x in common]
        return 1 + sum(w > v for w in others) + (sum(w == v for w in others) - 1) / 2

    ranks = [[rank(a, s) for s in common] for a in aucs]
    got = {row["curve"]: row for row in c["accuracy"]["ranks"]}
    for j, s in enumerate(common):
        assert [got[s][f"smollm2-135m / {t}"] for t in (TASK, "piqa")] == [ranks[0][j], ranks[1][j]]
    with np.errstate(invalid="ignore", divide="ignore"):  # a ranking all ties has no correlation: NaN, checked below
        expected = np.corrcoef(ranks[0], ranks[1])[0, 1]
    got_rho = c["accuracy"]["pairs"][0]["spearman"]  # JSON null where a ranking is all ties (no correlation)
    assert (got_rho is None and np.isnan(expected)) or got_rho == pytest.approx(expected)
    page = (run.out / "report.html").read_text()
    assert "Comparison of sweeps across models and tasks" in page and 'id="compare"' in page
    assert {"compare_ranks.csv", "compare_pairs.csv", "compare_inputs.csv"} <= set(results["files"])


def test_rerun_reuses_the_cached_stages(run, results, tmp_path):
    out = tmp_path / "rerun"
    shutil.copytree(run.out, out)  # a copy: the browser test reads the original
    stamp = {p.name: p.stat().st_mtime_ns for p in (out / "cache").rglob("*") if p.is_file()}
    proc = run_cli([*QUICK_ARGS, "--no-png", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads((out / "results.json").read_text())
    assert again["scores"][TASK]["reused_from_cache"] is True
    assert again["scores"][TASK]["mean_per_head"] == results["scores"][TASK]["mean_per_head"]
    assert again["rank"]["max_rank"] == results["rank"]["max_rank"]
    assert again["ablation"][TASK]["curves"] == results["ablation"][TASK]["curves"]
    assert again["effects"][TASK]["size_per_head"] == results["effects"][TASK]["size_per_head"]
    after = {p.name: p.stat().st_mtime_ns for p in (out / "cache").rglob("*") if p.is_file()}
    rewritten = [k for k in stamp if after[k] != stamp[k] and not k.endswith("key.json")]
    assert rewritten == []  # nothing recomputed: no score, rank or sweep unit written again


# ---------------------------------------------------------------- the page


def test_page_is_self_contained_and_escapes_the_prompt(run):
    page = (run.out / "report.html").read_text()
    assert len(re.findall(r"plotly\.js v\d", page)) == 1 and "Plotly.newPlot" in page  # the bundle, once
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)\s*=\s*[\"']?(https?:)?//", page, re.I)
    assert "unpkg.com/circuitsvis" not in page
    # The prompt shows as text: escaped in HTML, and never a raw tag outside script data.
    assert "Prompt 1: &lt;b&gt;bold&lt;/b&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>bold</b>" not in page


# ---------------------------------------------------------------- command line errors


@pytest.mark.parametrize("args, words", [
    (["--n", "0"], "--n"),
    (["--tasks", "arc_easy,nope"], "unknown task 'nope'"),
    (["--scores", "AHON (LN),XYZ"], "unknown score 'XYZ'"),
    (["--fractions", "0.1,1.5"], "[0, 1)"),
    (["--batch-size", "-3"], "--batch-size"),
    (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "nodevice"], "device"),
    (["--bogus"], "unrecognized arguments"),
    (["--compare", "no/such/sweep.json"], "neither a sweep folder"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, args, words):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("kwargs, words", [
    (dict(n=0), "ReportConfig(n=...): expected a positive whole number"),
    (dict(n=True), "ReportConfig(n=...)"),
    (dict(fractions=(0.1, 1.5)), "ReportConfig(fractions=...): fractions must lie in [0, 1)"),
    (dict(tasks=("arc",)), "ReportConfig(tasks=...): unknown task 'arc'"),
    (dict(scores=("XYZ",)), "ReportConfig(scores=...): unknown score 'XYZ'"),
    (dict(dtype="f8"), "ReportConfig(dtype=...): choose one of float32"),
    (dict(backend="x"), "ReportConfig(backend=...): choose one of hooked, bridge"),
    (dict(prompts=("",)), "ReportConfig(prompts=...): each prompt must be a non-empty string"),
    (dict(compare=("no/such/sweep.json",)), "ReportConfig(compare=...): 'no/such/sweep.json' is neither"),
    (dict(png="yes"), "ReportConfig(png=...): expected True or False"),
    (dict(task_file="no/such.jsonl"), "ReportConfig(task_file=...): task file 'no/such.jsonl' does not exist"),
])
def test_report_config_built_in_python_meets_the_flags_checks(kwargs, words):
    """A ReportConfig built in Python (not through the command line) was not validated at all."""
    with pytest.raises(ValueError) as e:
        ReportConfig(**kwargs)
    assert words in str(e.value)


def test_report_config_built_in_python_is_normalised_as_the_flags_are():
    config = ReportConfig(tasks=["piqa", "arc_easy"], fractions=[0.2, 0.1], scores=["ahon_ln"])
    assert config.tasks == ("piqa", "arc_easy") and config.fractions == (0.0, 0.1, 0.2)
    assert config.scores == ("AHON (LN)",)


def test_unknown_model_exits_nonzero_with_one_line_reason(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["no-such-model-xyz", "--out", str(tmp_path / "r"), "--no-progress"])
    assert e.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "no-such-model-xyz" in errors[0] and "smollm2-135m" in errors[0]


def test_unreachable_hub_model_exits_fast_with_what_to_do(capsys, tmp_path, no_network, monkeypatch):
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))  # as if nothing were cached
    with pytest.raises(SystemExit) as e:
        main(["gpt2-medium", "--out", str(tmp_path / "r"), "--no-progress"])
    assert e.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "unreachable" in errors[0] and "smollm2-135m" in errors[0]


def test_score_names_parse_loosely():
    from lens_heads.report.__main__ import config_from_args

    cfg = config_from_args(["--scores", "ahon_ln, AWFT,awft (ln)", "--fractions", "0.3,0.1"])
    assert cfg.scores == ("AHON (LN)", "AWFT", "AWFT (LN)")
    assert cfg.fractions == (0.0, 0.1, 0.3)
    assert config_from_args(["--quick", "--n", "5"]).n == 5  # explicit values beat the preset
    quick = config_from_args(["--quick"])
    assert quick.n == QUICK["n"] and quick.quick is True and quick.to_dict()["quick"] is True  # results say so
    assert config_from_args([]).quick is False


# ---------------------------------------------------------------- building blocks


def test_render_escapes_every_text_block():
    evil = '<img src=x onerror=alert(1)>"&'
    page = render_page(evil, evil, [Section(evil, [Text(evil), Table(pd.DataFrame({evil: [evil, 1.5]}), evil)])])
    assert "<img" not in page
    assert page.count("&lt;img src=x onerror=alert(1)&gt;&quot;&amp;") >= 6  # title, header, nav, h2, p, th/td...


def test_script_safe_keeps_tokens_inside_their_script():
    import circuitsvis as cv

    tokens = ["<bos>", "</script><b>x</b>", "<!--", "ok"]
    src = script_safe(cv.attention.attention_heads(attention=torch.rand(1, 4, 4), tokens=tokens).local_src)
    body = src[src.rindex("CircuitsVis.render("):]
    assert body.count("</script>") == 1 and body.rstrip().endswith("</script>")
    assert "<!--" not in body and "<\\/script><b>x<\\/b>" in body
    assert re.search(r'<div id="circuits-vis-[^"]*"[^>]*></div>', src)  # the mount point is closed


def test_pick_heads_by_direction():
    mean = torch.tensor([[0.5, 3.0, 1.0], [0.1, 2.0, 0.7]])
    low_inactive = pick_heads(mean, "<", 2)
    assert low_inactive == {"most active": [(0, 1), (1, 1)], "least active": [(1, 0), (0, 0)]}
    high_inactive = pick_heads(mean, ">", 2)  # AWFT: a high score is the inactive side
    assert high_inactive == {"most active": [(1, 0), (0, 0)], "least active": [(0, 1), (1, 1)]}


@pytest.mark.slow  # head effects, scores and agreement: seconds
def test_effects_stage_matches_the_library(tmp_path):
    """The report's head-effects stage on a tiny model: its effects and agreement table are the library's, and a
    rerun reads them from the cache."""

    from lens_heads import head_effects, load_task, score_heads
    from lens_heads.experiments.agreement import score_agreement
    from lens_heads.models.loading import tiny_model
    from lens_heads.plumbing.cache import Cache
    from lens_heads.report.config import ReportConfig
    from lens_heads.report.stages import effects_stage

    tokenizer = tiny_tokenizer()
    model = tiny_model("llama", d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=512)
    task = load_task("piqa", n=4, seed=0)
    scores = score_heads(model, task, progress=False)
    cache, key, config = Cache(tmp_path), {"model": "tiny-llama"}, ReportConfig(n=4, progress=False)
    result = effects_stage(model, task, scores, config, cache, key)
    fresh = head_effects(model, task, method="attribution", progress=False)
    np.testing.assert_allclose(result.numbers["size_per_head"], fresh.size().numpy(), atol=1e-6)
    expected = score_agreement(scores, fresh, n_boot=200, seed=0).to_dataframe()
    np.testing.assert_allclose(result.tables["effects_agreement_piqa"]["spearman"], expected["spearman"], atol=1e-6)
    assert list(tmp_path.glob("effects-*.safetensors"))
    again = effects_stage(model, task, scores, config, cache, key)
    assert again.numbers["size_per_head"] == result.numbers["size_per_head"]


def test_findings_box_states_what_the_intervals_support(run, results):
    html = (run.out / "report.html").read_text()
    assert len(html.encode()) < 10_000_000  # the page stays under 10 MB
    assert html.index('id="findings"') < html.index('id="model-card"')
    tests = results["ablation"][TASK]["tests"]
    kl = tests["best_vs_random_kl"]
    text = re.sub(r"<[^>]+>", "", html)  # the words a reader sees: a term's first use is a link to the box's glossary
    claimed = f"{kl['a']} costs less than random" in text or "costs less than " + kl["a"] in text
    assert claimed == (kl["verdict"] != "cannot tell apart" and kl["p_value"] < 0.05)
    assert (f"cannot tell {kl['a']} and random apart by KL AUC" in text) == (kl["verdict"] == "cannot tell apart")
    low, high = kl["low"], kl["high"]
    assert f"[{low:.2f}, {high:.2f}]" in text
    box = html[html.index('id="findings"'):]
    box = box[:box.index("</section>")]
    linked = re.findall(r'<a href="#(glossary-[^"]+)">', box)
    assert linked and len(linked) == len(set(linked))  # each term linked once, at its first use
    assert all(f'<dt id="{anchor}">' in box for anchor in linked)  # to an entry the box carries


def test_sweep_summary_has_human_headings_and_intervals(run):
    html = (run.out / "report.html").read_text()
    section = html[html.index('id="ablation-arc_easy"'):]
    section = section[:section.index("</section>")]
    assert "% zeroable within 1 point (authors&#x27; rule)" in section
    assert "zeroable_within_1_point" not in section and "normalised_auc" not in section
    assert re.search(r"\d\.\d{3}\u00a0\[\d\.\d{3},\u00a0\d\.\d{3}\]", section)  # KL AUC [lo, hi]
    assert section.count("\u00a0[") == 7 * 3  # seven summaries with intervals, for AWFT, AHON (LN) and random


def test_summary_table_formats_intervals():
    from lens_heads.report.findings import summary_table

    df = pd.DataFrame([{"score": "AWFT", "ends_within_1_point": True, "normalised_auc_kl": 0.5,
                        "normalised_auc_kl_low": 0.25, "normalised_auc_kl_high": 0.75, "kl_at_10pct": float("nan")}])
    out = summary_table(df)
    assert list(out.columns) == ["score", "KL AUC (nats)", "KL at 10% zeroed (nats)",
                                 "ends within 1 point of the baseline"]
    assert out.iloc[0].tolist() == ["AWFT", "0.500\u00a0[0.250,\u00a00.750]", "n/a", "yes"]


def test_findings_call_a_difference_only_when_interval_and_test_agree():
    from lens_heads.stats.calling import call_table, sentence

    test = dict(a="AHON (LN)", b="random", difference=-0.6, low=-0.8, high=-0.4, p_value=0.001, higher_is_better=False)

    def said(**change):
        return sentence(call_table(pd.DataFrame([{**test, **change}])).iloc[0].to_dict(), "KL AUC",
                        lower_is_better=True)

    assert said().startswith("AHON (LN) costs less than random by KL AUC: difference (AHON (LN) − random) -0.60 "
                             "[-0.80, -0.40]")
    assert said(p_value=0.2).startswith("the two tests disagree on AHON (LN) against random by KL AUC")
    assert said(low=-0.8, high=0.1, p_value=0.2).startswith("the data cannot tell AHON (LN) and random apart by KL AUC")
    assert sentence(call_table(pd.DataFrame([{**test, "difference": 5.0, "low": 2.0, "high": 8.0,
                                              "higher_is_better": True}])).iloc[0].to_dict(),
                    "% zeroable").startswith("AHON (LN) beats random by % zeroable")


def run_table(html: str) -> dict[str, list[str]]:
    """The Run section's stage table as {stage: [status, seconds, CPU seconds, note]} (cells as rendered)."""
    section = html[html.index('id="run"'):]
    table = section[:section.index("</table>")]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]
    return {cells[0]: cells[1:] for cells in rows if cells}


def test_a_stage_whose_input_failed_is_not_run_and_says_which(tmp_path, monkeypatch, capsys):
    """The scores stage failing on one task: its ablation sweep is not rescored from scratch but not run, saying
    it needs the scores, and so are the stages built on the first task's scores and the comparison of the sweeps;
    the other task's stages run, and the command exits 1 naming the stage that failed."""
    from conftest import text_model
    from lens_heads.report import pipeline, stages, sweep_stages

    model = text_model(n_ctx=512)
    monkeypatch.setattr(pipeline, "load_model", lambda *args, **kwargs: model)
    score_stage, ablation_stage, ablated = stages.score_stage, sweep_stages.ablation_stage, []

    def broken_scores(model, task, *args):
        if task.name == "arc_easy":
            raise RuntimeError("scores broke")
        return score_stage(model, task, *args)

    def ablation_spy(model, task, *args):
        ablated.append(task.name)
        return ablation_stage(model, task, *args)

    monkeypatch.setattr(stages, "score_stage", broken_scores)
    monkeypatch.setattr(sweep_stages, "ablation_stage", ablation_spy)
    out = tmp_path / "report"
    code = main(["tiny", "--tasks", "arc_easy,piqa", "--quick", "--n", "2", "--rank-n", "2", "--fractions", "0,0.25",
                 "--scores", "AWFT", "--no-png", "--no-progress", "--out", str(out)])
    assert code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "stage(s) scores:arc_easy failed" in errors[0]
    assert ablated == ["piqa"]
    results = json.loads((out / "results.json").read_text())
    st = results["stages"]
    assert st["scores:arc_easy"]["status"] == "failed" and "scores broke" in st["scores:arc_easy"]["reason"]
    for name in ("ablation:arc_easy", "attention", "explorer"):
        assert (st[name]["status"], st[name]["reason"]) == ("not run", "needs scores:arc_easy"), name
    assert (st["compare"]["status"], st["compare"]["reason"]) == ("not run", "needs ablation:arc_easy")
    assert st["ablation:piqa"]["status"] == st["rank"]["status"] == "done"
    assert set(results["ablation"]) == {"piqa"}
    # --quick leaves out the head effects and whole layers by its skip value, whatever their inputs did
    skipped = {"status": "skipped", "reason": "--quick"}
    assert results["effects"] == {"arc_easy": skipped, "piqa": skipped} and results["layers"] == skipped
    assert all((st[name]["status"], st[name]["reason"]) == ("skipped", "--quick")
               for name in ("effects:arc_easy", "effects:piqa", "layers"))
    page = (out / "report.html").read_text()
    for anchor in ("effects-arc_easy", "effects-piqa", "layers"):
        section = page[page.index(f'id="{anchor}"'):]
        assert "Skipped under --quick." in section[:section.index("</section>")], anchor
    table = run_table(page)
    assert table["ablation:arc_easy"][0] == "not run" and table["ablation:arc_easy"][-1] == "needs scores:arc_easy"
    assert table["scores:arc_easy"][0] == "failed" and "scores broke" in table["scores:arc_easy"][-1]


def _outputs_with_figures(tmp_path, figures: dict):
    """write_outputs on one finished stage holding ``figures``: results.json's PNG entry, the files and the page."""
    from lens_heads.report import pipeline, stage_result, stages

    config = ReportConfig(out=str(tmp_path), progress=False)
    meta = dict(name="tiny", source="test", n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, d_head=16, n_ctx=64,
                n_params=1, weight_basis="raw", dtype="float32")
    results = {"model": meta, "weight_basis": "raw", "versions": {"lens_heads": "test"}, "created": "now"}
    ran = [pipeline.Ran("figures", "done", result=stage_result.StageResult({}, figures=figures))]
    files, png = pipeline.write_outputs(tmp_path, config, stages.model_card(meta, config), ran, results,
                                        lambda msg: None)
    return png, files, (tmp_path / "report.html").read_text()


def test_a_figure_that_fails_to_draw_fails_the_png_step_and_shows_in_the_run_table(tmp_path, monkeypatch):
    import plotly.graph_objects as go

    from lens_heads.plumbing.io import atomic_write_bytes
    from lens_heads.viz import export

    good, bad = go.Figure(go.Scatter(y=[1, 2])), go.Figure(go.Bar(y=[3]))

    @contextlib.contextmanager
    def writer():  # kaleido as it answers a figure it can't draw; no Chromium needed for the test
        def write(fig, path):
            if fig is bad:
                raise ValueError("Invalid value of type 'builtins.str' received for 'marker.color'")
            return atomic_write_bytes(path, b"\x89PNG\r\n\x1a\n")

        yield write

    monkeypatch.setattr(export, "png_writer", writer)
    png, files, page = _outputs_with_figures(tmp_path, {"bad_figure": bad, "good_figure": good})
    assert png["status"] == "failed"
    assert png["reason"].startswith("1 of 2 figures not drawn: bad_figure: ValueError: Invalid value")
    assert "good_figure.png" in files and "bad_figure.png" not in files and (tmp_path / "good_figure.png").exists()
    table = run_table(page)
    assert table["png"][0] == "failed" and "bad_figure: ValueError" in table["png"][-1]


def test_a_task_named_by_a_path_gives_files_not_folders(tmp_path, monkeypatch):
    """An lm-eval task given as a YAML path (``lm_eval:dir/x.yaml``) names its tables and figures: one file each in
    the report folder, the path's separators and the colon replaced."""
    import plotly.graph_objects as go

    from lens_heads.plumbing.io import atomic_write_bytes
    from lens_heads.report import pipeline, stage_result, stages
    from lens_heads.viz import export

    @contextlib.contextmanager
    def writer():
        yield lambda fig, path: atomic_write_bytes(path, b"\x89PNG\r\n\x1a\n")

    monkeypatch.setattr(export, "png_writer", writer)
    task = "lm_eval:tests/data/lm_eval/arc_easy_local.yaml"
    config = ReportConfig(out=str(tmp_path), progress=False)
    meta = dict(name="tiny", source="test", n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, d_head=16, n_ctx=64,
                n_params=1, weight_basis="raw", dtype="float32")
    results = {"model": meta, "weight_basis": "raw", "versions": {"lens_heads": "test"}, "created": "now"}
    result = stage_result.StageResult({}, tables={f"thresholds_{task}": pd.DataFrame({"a": [1]})},
                                      figures={f"ablation_{task}": go.Figure(go.Scatter(y=[1, 2]))})
    files, _ = pipeline.write_outputs(tmp_path, config, stages.model_card(meta, config),
                                      [pipeline.Ran("scores", "done", result=result)], results, lambda msg: None)
    flat = "lm_eval_tests_data_lm_eval_arc_easy_local.yaml"
    assert {f"thresholds_{flat}.csv", f"ablation_{flat}.png"} <= set(files)
    assert all((tmp_path / f).is_file() for f in files if f != "results.json")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == []


def test_without_chromium_the_png_step_is_skipped_saying_what_to_install(tmp_path, monkeypatch):
    """kaleido's figure server started without a Chromium waits for it for ever: the writer asks first."""
    import plotly.graph_objects as go
    from choreographer.browsers.chromium import Chromium

    from lens_heads.viz import export

    monkeypatch.setattr(Chromium, "find_browser", classmethod(lambda cls, **kwargs: None))
    png, files, page = _outputs_with_figures(tmp_path, {"figure": go.Figure(go.Scatter(y=[1, 2]))})
    assert png["status"] == "skipped" and "no Chromium" in png["reason"] and "apt-get install chromium" in png["reason"]
    assert not [f for f in files if f.endswith(".png")] and not list(tmp_path.glob("*.png"))
    assert run_table(page)["png"][0] == "skipped" and "no Chromium" in run_table(page)["png"][-1]
    with pytest.raises(export.PngUnavailable, match="no Chromium"):  # save_figure's PNG path asks too
        export.png_bytes(go.Figure())


def test_a_figure_server_that_does_not_start_is_said(monkeypatch, tmp_path):
    import kaleido
    from choreographer.browsers.chromium import Chromium

    from lens_heads.viz import export

    monkeypatch.setattr(Chromium, "find_browser", classmethod(lambda cls, **kwargs: sys.executable))  # a file
    monkeypatch.setattr(kaleido, "start_sync_server", lambda **kwargs: (_ for _ in ()).throw(OSError("no pipe")))
    monkeypatch.setattr(kaleido, "stop_sync_server", lambda **kwargs: pytest.fail("stopped a server never started"))
    with pytest.warns(RuntimeWarning, match=r"kaleido's figure server did not start \(OSError: no pipe\)"):
        with export.png_writer():
            pass


def test_the_stage_table_runs_per_task_or_once_on_what_each_stage_needs():
    """A table of toy stages (no model): per-task stages run on each task, the others once on the first; a stage
    takes the results it needs (a list where it needs every task's), is not run where one failed, gets None for a
    used stage that did not finish, is skipped by its skip value and absent where the report has no place for it (a
    stage that needs it is not run); results.json and the page follow the table."""
    from lens_heads.report import pipeline, stages
    from lens_heads.report.render import Section as PageSection
    from lens_heads.report.stage_result import StageResult
    from lens_heads.report.stage_table import Inputs, Need, Skip, Stage

    def count(inputs, task):
        if task == "broken":
            raise ValueError("no count")
        return StageResult({"n": len(task)})

    calls = []

    def peek(inputs, task, first_count, doubles):
        calls.append((task, first_count.numbers if first_count else None, [d and d.numbers for d in doubles]))
        return StageResult({"seen": task})

    shown = lambda r, basis: PageSection(f"shown {r.numbers}")  # noqa: E731
    table = (
        Stage("count", "Count", per_task=True, compute=count, section=shown),
        Stage("double", "Double", per_task=True, needs=(Need("count"),), section=shown,
              compute=lambda i, task, c: StageResult({"n": 2 * c.numbers["n"]})),
        Stage("total", "Total", needs=(Need("double", every_task=True),), section=shown,
              compute=lambda i, task, doubles: StageResult({"n": sum(d.numbers["n"] for d in doubles)})),
        Stage("peek", "Peek", uses=(Need("count"), Need("double", every_task=True)), compute=peek, section=shown),
        Stage("slow", "Slow", needs=(Need("count"),), section=shown, compute=lambda i, task, c: pytest.fail("ran"),
              skip=lambda settings: Skip.QUICK if settings.quick else None,
              skipped_section=lambda task: PageSection(f"skipped note {task}")),
        Stage("absent", "Absent", compute=lambda i, task: pytest.fail("ran"), section=shown,
              present=lambda settings, n_tasks: n_tasks > 2),
        Stage("orphan", "Orphan", needs=(Need("absent"),), compute=lambda i, task, a: pytest.fail("ran"),
              section=shown),
    )
    config = ReportConfig(quick=True, progress=False)
    tasks = {"abc": "abc", "broken": "broken"}  # the task data: strings stand in for Task objects
    ran = pipeline.run_stages(table, Inputs(None, config, None, {}), tasks, lambda msg: None)
    got = {r.name: (r.status, r.reason) for r in ran}
    assert got == {"count:abc": ("done", ""), "count:broken": ("failed", "ValueError: no count"),
                   "double:abc": ("done", ""), "double:broken": ("not run", "needs count:broken"),
                   "total": ("not run", "needs double:broken"), "peek": ("done", ""), "slow": ("skipped", "--quick"),
                   "orphan": ("not run", "needs absent")}
    assert [r.result.numbers for r in ran if r.name in ("count:abc", "double:abc")] == [{"n": 3}, {"n": 6}]
    # peek runs once on the first task's data, with the first task's count and every task's double (None: not run)
    assert calls == [("abc", {"n": 3}, [{"n": 6}, None])]
    assert next(r for r in ran if r.name == "slow").skip is Skip.QUICK

    meta = dict(name="toy", source="test", n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, d_head=16, n_ctx=64,
                n_params=1, weight_basis="raw", dtype="float32")
    results = pipeline.describe(config, meta, {}, ran)
    assert results["count"] == {"abc": {"n": 3}} and results["double"] == {"abc": {"n": 6}}
    assert results["peek"] == {"seen": "abc"} and results["slow"] == {"status": "skipped", "reason": "--quick"}
    assert "total" not in results and "absent" not in results
    page = pipeline.page_sections(stages.model_card(meta, config), ran, config, "raw")
    titles = [s.title for s in page][2:]  # after the findings and the model card, in the table's order
    assert titles == ["shown {'n': 3}", "Count on broken (failed)", "shown {'n': 6}", "Double on broken (not run)",
                      "Total (not run)", "shown {'seen': 'abc'}", "skipped note None", "Orphan (not run)"]


def test_the_report_stage_table_declares_each_stage_once_after_what_it_takes():
    """Every stage of the report's table has its own kind, and what it needs or uses comes before it (the table's
    order is the order they run in)."""
    from lens_heads.report.stage_table import STAGES

    kinds = [s.kind for s in STAGES]
    assert len(set(kinds)) == len(kinds)
    for i, stage in enumerate(STAGES):
        assert {n.kind for n in (*stage.needs, *stage.uses)} <= set(kinds[:i]), stage.kind
        assert (stage.skipped_section is None) == (stage.skip(ReportConfig(quick=True, progress=False)) is None)
