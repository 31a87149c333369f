"""The analyses' paper-scale presets say what the specs say (they can't be run here: no GPU, no hub)."""

import numpy as np
import pytest

from conftest import LOGLIK_TOL, ROOT, load_script, tiny_tokenizer
from lens_heads.plumbing.errors import InputError


@pytest.mark.parametrize("preset, shape", [("gpt2-medium", (24, 1024, 16, 12, 24)), ("gpt2-xl", (48, 1600, 25, 24, 48))])
def test_gpt2_presets_are_the_papers_runs(preset, shape):
    """The paper (Sanyal et al.) and its authors' config: GPT-2 medium 24 layers (d 1024, 16 heads), students from 12
    layers growing by 2; GPT-2 XL 48 layers (d 1600, 25 heads), students from 24; both may grow up to the reference's
    depth (the paper's answers, 16 and 24, are outcomes to test, not caps); AdamW lr 2e-4 cosine to 1e-5, warmup
    2000, weight decay 0.1, betas (0.9, 0.95), clip 1.0, block 1024, about 49K tokens a step, 100K steps, on
    OpenWebText; growth keeps the trained student (the paper's recipe)."""
    script = load_script("inheritune")
    config = script.build_config(script.parse_args(["--preset", preset, "--device", "cuda"]))
    assert (config.ref_layers, config.d_model, config.n_heads, config.student_layers, config.max_layers) == shape
    assert config.n_ctx == 1024 and config.grow_by == 2 and config.grow_from == "student"
    t = config.train_config
    assert (t.steps, t.lr, t.min_lr, t.warmup_steps, t.weight_decay) == (100_000, 2e-4, 1e-5, 2000, 0.1)
    assert (t.beta1, t.beta2, t.grad_clip, t.seq_len) == (0.9, 0.95, 1.0, 1024)
    assert t.tokens_per_step == pytest.approx(49_000, rel=0.01)
    assert script.parse_args(["--preset", preset, "--device", "cuda"]).corpus == "openwebtext"
    assert set(config.ablations) == set(script.ABLATIONS)  # every baseline, the distillations included
    assert {"gpt2-medium": 16, "gpt2-xl": 24}[preset] == script.PAPER_DEPTHS[preset] < config.max_layers


def test_cpu_presets_keep_the_paper_presets_depth_ratios():
    script = load_script("inheritune")
    for cpu, gpu in (("cpu-medium", "gpt2-medium"), ("cpu-xl", "gpt2-xl")):
        small = script.build_config(script.parse_args(["--preset", cpu]))
        big = script.build_config(script.parse_args(["--preset", gpu, "--device", "cuda"]))
        scale = big.ref_layers / small.ref_layers
        assert (big.student_layers, big.max_layers) == (scale * small.student_layers, scale * small.max_layers)
        assert small.max_layers == small.ref_layers  # every preset may grow to its reference's depth
        if big.grow_by % scale == 0:  # the growth steps too where they scale (XL's 2 of 48 is a third of a layer at 8)
            assert big.grow_by == scale * small.grow_by
        assert small.train_config.steps == script.parse_args([]).steps and small.d_model == 64


def test_presets_refuse_devices_they_cannot_run_on(capsys, tmp_path):
    import pandas as pd

    script = load_script("inheritune")
    for preset in ("gpt2-medium", "gpt2-xl"):
        with pytest.raises(SystemExit):
            script.parse_args(["--preset", preset, "--device", "cpu"])
        err = capsys.readouterr().err
        assert "needs a CUDA GPU" in err and "--preset cpu-" in err
    plan = script.main(["--preset", "gpt2-xl", "--device", "cpu", "--plan", "--figures", str(tmp_path)])  # its cost
    assert plan["stage"].iloc[0] == "reference_48L" and plan["gpu_hours"].sum() > 100
    written = pd.read_csv(tmp_path / "inheritune_plan_gpt2-xl.csv")
    assert written["flops"].tolist() == pytest.approx(plan["flops"].tolist())
    # the committed record has no training rate: the share is its evaluator's on the measured model nearest the
    # reference in weights (by ratio), assumed, and the plan says so in every row
    import json
    import math

    record = json.loads((ROOT / "docs/records/gpu_check.json").read_text())
    a = script.parse_args(["--preset", "gpt2-xl", "--plan"])
    reference = a.ref_layers * 12 * a.d_model ** 2 + a.d_model * a.vocab  # GPT-2: 12 d^2 a layer, the embedding
    nearest = min(record["shapes"], key=lambda r: abs(math.log(r["n_params"] / reference)))
    # float64 through the CSV: 1e-12 absorbs the division's rounding
    assert written["gpu_fraction"].tolist() == pytest.approx(
        [nearest["evaluator_flops_per_s"] / 989e12] * len(written), rel=1e-12)
    assert written["gpu_fraction_source"].str.startswith(f"assumed: the share lens_heads' evaluator reached on "
                                                         f"{nearest['shape']} (").all()
    with pytest.raises(SystemExit):
        script.parse_args(["--distill-temperature", "0"])
    assert "temperature must be > 0" in capsys.readouterr().err


def test_plan_takes_the_share_a_gpu_record_measured_or_the_one_given(tmp_path):
    """--plan's GPU-hours at the training share of --gpu-record's row for the preset (hours = FLOPs / measured
    FLOP/s / 3600, done here), at --gpu-fraction where given; the CSV's columns say which."""
    import json

    import pandas as pd

    script = load_script("inheritune")
    rate = 2.0e14  # FLOP/s lens_heads' loop reached on the gpt2-xl shape, in a made-up record
    record = tmp_path / "gpu_check.json"
    record.write_text(json.dumps(dict(
        machine="2026-12-07; NVIDIA H200", device="cuda", smoke=False, provenance=dict(recorded_at="2026-12-07T10:00:00"),
        training=[dict(shape="gpt2-xl", device_name="NVIDIA H200", loop_flops_per_s=rate, error=None)])))

    def planned(*flags: str) -> pd.DataFrame:
        script.main(["--preset", "gpt2-xl", "--plan", "--figures", str(tmp_path), *flags])
        return pd.read_csv(tmp_path / "inheritune_plan_gpt2-xl.csv")

    measured = planned("--gpu-record", str(record))  # the CSV keeps float64 exactly: 1e-12 absorbs division order
    total = measured["flops"] + measured["teacher_flops"]
    assert measured["gpu_hours"].tolist() == pytest.approx((total / rate / 3600).tolist(), rel=1e-12)
    assert measured["gpu_fraction"].tolist() == pytest.approx([rate / 989e12] * len(measured), rel=1e-12)
    assert (measured["gpu_fraction_source"] == "measured on NVIDIA H200 2026-12-07").all()
    assert (measured["gpu_peak_tflops"] == 989.0).all()
    given = planned("--gpu-record", str(record), "--gpu-fraction", "0.3")
    assert given["gpu_hours"].tolist() == pytest.approx((total / (989e12 * 0.3) / 3600).tolist(), rel=1e-12)
    assert (given["gpu_fraction_source"] == "given: --gpu-fraction 0.3").all() and (given["gpu_fraction"] == 0.3).all()
    with pytest.raises(InputError, match="--gpu-record .*no such file"):
        planned("--gpu-record", str(tmp_path / "missing.json"))
    with pytest.raises(SystemExit):
        script.parse_args(["--preset", "gpt2-xl", "--plan", "--gpu-fraction", "1.5"])


def test_rank_windows_must_fit_the_models_context():
    script = load_script("inheritune")
    args = script.parse_args([])
    assert args.rank_len <= args.seq_len
    with pytest.raises(SystemExit):
        script.parse_args(["--rank-len", str(args.seq_len + 1)])


def test_head_effects_analysis_end_to_end_on_a_tiny_model(tmp_path):
    """The analysis on a tiny llama (8 heads) and 3 PIQA items: every output is written, says what it is, and its
    attribution-vs-ablation correlation is that of the stored effects."""
    import json

    import numpy as np

    from lens_heads.experiments.effects import HeadEffects
    from lens_heads.models.loading import tiny_model
    from lens_heads.stats.inference import spearman

    script = load_script("head_effects")
    tokenizer = tiny_tokenizer()
    model = tiny_model("llama", d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=512)
    args = script.parse_args(["--n", "3", "--heldout-n", "2", "--fractions", "0,.25", "--n-boot", "20",
                              "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "fig"), "--no-png"])
    fig = tmp_path / "fig"
    fig.mkdir()
    for suffix in (".csv", ".json"):  # the recorded sweep the oracle is drawn over
        (fig / f"sweep_piqa{suffix}").write_text((ROOT / "figures" / f"sweep_piqa{suffix}").read_text())
    script.run_task(model, "piqa", args)
    names = {p.name for p in fig.iterdir()}
    assert {"head_effects_piqa.json", "head_effects_piqa.csv", "head_effects_agreement_piqa.csv",
            "head_effects_oracle_piqa.html", "head_effects_agreement_piqa.html",
            "head_effects_scatter_piqa.html", "head_effects_attribution_piqa.html"} <= names
    result = json.loads((fig / "head_effects_piqa.json").read_text())
    assert result["n"] == 3 and result["heldout_n"] == 2 and result["seed"] == 0
    assert result["weight_basis"] == "raw (no weight processing)" and result["data"]["task"] == "piqa"
    assert result["protocol"] == "lm-eval"
    assert result["provenance"]["recorded_at"] and result["provenance"]["versions"]["torch"] != "not installed"
    assert len(result["agreement"]) == 12 * 2 * 2  # scores x methods x metrics
    stored = {m: HeadEffects.load(next((tmp_path / "runs" / "piqa").glob(f"{m}-*/effects.safetensors")))
              for m in ("ablation", "attribution")}
    expected = spearman(stored["attribution"].size("kl").reshape(-1).numpy(),
                        stored["ablation"].size("kl").reshape(-1).numpy())
    assert result["attribution_vs_ablation"]["kl"]["spearman"] == pytest.approx(float(expected))
    order = [list(h) for h in stored["ablation"].order("kl")]
    assert result["oracle"]["order"] == order
    assert {r["score"] for r in result["oracle"]["table"]} == {"oracle (ranking items)", "oracle (held-out items)"}
    recorded = json.loads((ROOT / "figures" / "sweep_piqa.json").read_text())
    assert result["recorded_sweep"] == {"file": "sweep_piqa.csv", "protocol": recorded.get("protocol", "tl")}
    html = (fig / "head_effects_oracle_piqa.html").read_text()
    assert "oracle (held-out items)" in html and "AHON (LN)" in html  # drawn beside the recorded curves
    assert np.isfinite([r["spearman"] for r in result["agreement"]]).any()
    # drawn again over another sweep without a model: the figure shows that sweep and the JSON says so
    (fig / "head_effects_oracle_piqa.html").unlink()
    (fig / "sweep_piqa.csv").write_text((ROOT / "figures" / "sweep_arc_easy.csv").read_text().replace("AHON", "NOHA"))
    script.main(["--redraw", "--tasks", "piqa", "--figures", str(fig), "--no-png"])
    html = (fig / "head_effects_oracle_piqa.html").read_text()
    assert "NOHA (LN)" in html and "oracle (held-out items)" in html
    redrawn = json.loads((fig / "head_effects_piqa.json").read_text())
    assert redrawn["oracle"] == result["oracle"] and redrawn["provenance"] == result["provenance"]  # the run's, kept


def test_gsm8k_analysis_on_a_tiny_model(tmp_path):
    """Exact match and the bits-per-byte table on a tiny llama and 2 items: the intact bits per byte is the gold
    answer's, read by hand from a plain forward over each item's row, and every zeroed point is paired with it."""
    import json
    import math

    import torch

    from lens_heads.data.rows import build_rows
    from lens_heads.data.tasks import load_task
    from lens_heads.models.loading import tiny_model

    script = load_script("gsm8k")
    tokenizer = tiny_tokenizer()
    model = tiny_model("llama", d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=2048)
    args = script.parse_args(["--n", "2", "--max-new-tokens", "3", "--fractions", "0,.25", "--out",
                              str(tmp_path / "runs"), "--figures", str(tmp_path / "fig"), "--no-png"])
    table = script.run(model, args)
    result = json.loads((tmp_path / "fig" / "gsm8k.json").read_text())
    assert {p.name for p in (tmp_path / "fig").iterdir()} == {"gsm8k.json", "gsm8k.csv", "gsm8k.html"}
    assert result["exact_match"]["n"] == 2 and result["model"]["weight_basis"] == "raw (no weight processing)"
    assert all(a["n_new_tokens"] <= 3 for a in result["generated_answers"])
    task = load_task("gsm8k", n=2, seed=0)
    by_hand = []
    with torch.no_grad():
        for item, row in zip(task, build_rows(model, list(task))):
            (choice, first, ids), = row.reads
            logp = torch.log_softmax(model(torch.tensor([row.tokens]))[0].double(), dim=-1)
            gold = sum(logp[first + k, t].item() for k, t in enumerate(ids))
            by_hand.append(-gold / math.log(2) / len(item.continuations[0].encode("utf-8")))
    # the evaluator's float32 path against a plain forward: a log-likelihood's rounding, scaled by 1 / (ln 2 bytes)
    assert result["intact_bits_per_byte"] == pytest.approx(sum(by_hand) / 2, rel=LOGLIK_TOL["rtol"],
                                                           abs=LOGLIK_TOL["atol"])
    assert set(table["curve"]) == {"AHON (LN)", "random"}
    zeroed = table[table["target_fraction"] > 0]
    assert len(zeroed) == 2 and (zeroed["realised_fraction"] > 0).all()
    intact = table[table["target_fraction"] == 0]
    assert (intact["bits_per_byte_change"] == 0).all()
    again = script.run(model, args)  # every unit and the generations come from --out
    assert again["bits_per_byte"].tolist() == table["bits_per_byte"].tolist()


@pytest.mark.parametrize("model_flag, key", [([], "piqa"), (["--model", "google/gemma-3-270m"], "gemma-3-270m_piqa")])
def test_attribution_ranking_analysis_on_a_tiny_model(tmp_path, model_flag, key):
    """The analysis on a tiny llama against a sweep recorded with it on 6 PIQA items (2 calibration, 4 held out):
    every output is written and says what it is, the attribution order is head_effects' on the calibration items,
    and every curve (scores, random, oracle, attribution static, mean-ablated and per input) is tested against
    the attribution ranking on the held-out items. Under another model than the embedded one, every recorded input
    and output is named <model>_<task>, as the sweep names its files (no other model's files are read or written)."""
    import json

    from lens_heads.data.tasks import load_task
    from lens_heads.experiments.effects import head_effects
    from lens_heads.models.loading import tiny_model
    from lens_heads.sweep.run import run_sweep
    from lens_heads.sweep.unit_store import save_units

    script = load_script("attribution_ranking")
    tokenizer = tiny_tokenizer()
    model = tiny_model("llama", d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=512)
    fig = tmp_path / "fig"
    fig.mkdir()
    task, calibration = load_task("piqa", n=6, seed=0), load_task("piqa", n=2, seed=0)
    recorded = run_sweep(model, task, scores=["AHON (LN)"], static_scores=["AHON (LN)"], fractions=(0, .25),
                         batch_size=4, progress=False)
    save_units(recorded, fig / f"sweep_{key}_units.json.gz")
    heads = [[layer, head] for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
    (fig / f"head_effects_{key}.json").write_text(json.dumps(dict(
        data=dict(n=2, seed=0), oracle=dict(order=heads[::-1]), costs=dict(ablation=dict(cpu_s=1.0)))))
    args = script.parse_args([*model_flag, "--tasks", "piqa", "--n", "6", "--calibration-n", "2", "--fractions",
                              "0,.25", "--n-boot", "20", "--batch-size", "4", "--out", str(tmp_path / "runs"),
                              "--figures", str(fig), "--no-png"])
    script.run_task(model, "piqa", args)
    stem = f"attribution_ranking_{key}"
    assert {p.name for p in fig.iterdir() if p.name.startswith("attribution")} == {
        f"{stem}{s}" for s in (".json", ".csv", "_summary.csv", "_tests.csv", "_units.json.gz", ".html")}
    result = json.loads((fig / f"{stem}.json").read_text())
    assert result["seed"] == 0 and result["weight_basis"] == "raw (no weight processing)"
    assert result["data"]["task"] == "piqa" and result["chance"] == 0.5
    held = result["heldout"]["item_ids"]
    assert sorted(held + result["calibration"]["item_ids"]) == sorted(it.id for it in task) and len(held) == 4
    expected = head_effects(model, calibration, method="attribution", metric="kl", progress=False).order("kl")
    assert result["orders"]["attribution"] == [list(h) for h in expected]
    assert result["orders"]["oracle"] == heads[::-1]
    curves = {r["curve"] for r in result["summary"]}
    assert curves == {"AHON (LN)", "AHON (LN) (static)", "random", "attribution (static)", "oracle (static)",
                      "attribution, mean-ablated (static)", "attribution (per input)"}
    assert {r["a"] for r in result["tests"]} == curves - {"attribution (static)"}
    assert {r["b"] for r in result["tests"]} == {"attribution (static)"}
    assert result["costs"]["per_input"]["items"] == 4 and result["costs"]["attribution"]["items"] == 2


@pytest.mark.slow  # generation to the end of GSM8K answers: seconds
def test_gsm8k_generation_analysis_on_a_tiny_model(tmp_path):
    """Zeroing recomputed at every generated token: each zeroed generation equals a hand-rolled greedy loop that reruns
    prompt + tokens so far with a fresh threshold zeroing at every step; the threshold is the numpy quantile of the
    prompts' pooled scores; the realised share counts every step; a rerun reads every item back from --out."""
    import json

    import numpy as np
    import torch

    from lens_heads.ablation.hooks import threshold_zeroing
    from lens_heads.data.tasks import load_task
    from lens_heads.heads.scoring import score_heads
    from lens_heads.models.loading import tiny_model

    script = load_script("gsm8k_generation")
    tokenizer = tiny_tokenizer()
    model = tiny_model("llama", d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=2048)
    args = script.from_args(script.Settings, ["--n", "2", "--max-new-tokens", "3", "--fraction", "0.3", "--out",
                                              str(tmp_path / "runs"), "--figures", str(tmp_path / "fig"),
                                              "--n-resamples", "100"])
    record = script.run(model, args)
    task = load_task("gsm8k_lm_eval", n=2, seed=0)
    pooled = score_heads(model, [it.prompt for it in task], progress=False).score("AHON (LN)").double().numpy()
    threshold = float(np.quantile(pooled.reshape(-1), 0.3))
    assert record["threshold"]["value"] == pytest.approx(threshold)
    rows = json.loads((tmp_path / "fig" / "gsm8k_generation.json").read_text())
    assert rows["zeroed"]["generation"]["zeroing_recomputed_every_token"] and rows["intact"]["generation"]["cache"]
    stored = {r["record"]["id"]: r["record"] for r in
              (json.loads(p.read_text())["value"] for p in (tmp_path / "runs").glob("zeroed_*"))}
    decisions = []
    with torch.no_grad():
        for item in task:
            tokens = tokenizer(item.prompt, add_special_tokens=False)["input_ids"]
            new = []
            for _ in range(3):
                zeroing = threshold_zeroing(model, "AHON (LN)", threshold)
                with zeroing.batch(None, first=0):
                    logits = model.run_with_hooks(torch.tensor([tokens + new]), fwd_hooks=zeroing.hooks)
                decisions.append(zeroing.zeroed()[0])
                new.append(int(logits[0, -1].argmax()))
            assert stored[item.id]["text"] == tokenizer.decode(new) and stored[item.id]["zeroed"][0] == 3
    share = torch.stack(decisions).float().mean().item()
    assert rows["zeroed"]["realised_share"] == pytest.approx(share)
    csv = (tmp_path / "fig" / "gsm8k_generation.csv").read_text()
    assert csv.count("zeroed, recomputed every token") == 2 and csv.count("intact") == 2
    assert rows["intact"]["cost"]["new_tokens"] <= 6 and rows["zeroed"]["cost"]["cpu_s"] > 0
    intact_texts = {r["record"]["id"]: r["record"]["text"] for r in
                    (json.loads(p.read_text())["value"] for p in (tmp_path / "runs").glob("intact_*"))}
    changed = sum(intact_texts[i] != stored[i]["text"] for i in stored)
    assert rows["paired_difference"]["generations_changed"] == dict(
        items=changed, of=2, what=rows["paired_difference"]["generations_changed"]["what"])
    again = script.run(model, args)  # every item comes back from --out
    assert again["zeroed"]["summary"] == record["zeroed"]["summary"]


@pytest.mark.slow  # ~900-token GSM8K rows: tens of seconds on a busy 2-core machine
def test_kv_savings_analysis_on_a_tiny_model(tmp_path):
    """KV shares counted by hand from each head set (a KV group freed only with all its query heads), and the cost
    of the score's set read by hand: the gold answer's bits per byte from plain forwards with its heads zeroed."""
    import json
    import math

    import torch
    from transformers import AutoTokenizer

    from lens_heads.ablation.hooks import zero_heads
    from lens_heads.data.rows import build_rows
    from lens_heads.data.tasks import load_task
    from lens_heads.models.embedded import embedded_model_folder
    from lens_heads.models.loading import tiny_model

    script = load_script("kv_savings")
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_folder())
    model = tiny_model("llama", d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=2048)  # 4 heads on 2 KV heads
    s = script.parse_args(["--n", "2", "--scores", "AHON (LN)", "--fractions", "0.5", "--draws", "2",
                           "--n-resamples", "200", "--figures", str(tmp_path), "--no-png"])
    table = script.run(model, s).set_index("curve")
    record = json.loads((tmp_path / "kv_savings_gsm8k.json").read_text())
    sets = {(hs["curve"], hs["draw"]): [tuple(h) for h in hs["heads"]] for hs in record["head_sets"]}
    assert all(len(heads) == 4 for heads in sets.values())  # half of 2 layers x 4 heads

    def by_hand(heads):
        return sum(all((layer, h) in heads for h in (2 * kv, 2 * kv + 1)) for layer in range(2) for kv in range(2)) / 4

    assert table.loc["AHON (LN)", "kv_share"] == by_hand(sets["AHON (LN)", 0])
    random_share = (by_hand(sets["random", 0]) + by_hand(sets["random", 1])) / 2
    assert table.loc["random", "kv_share"] == pytest.approx(random_share)
    assert (table["physical_kv_share"] == 0).all()

    def bits_per_byte(heads):
        out = []
        with torch.no_grad():
            for item, row in zip(task, build_rows(model, list(task))):
                (choice, first, ids), = row.reads
                logits = model.run_with_hooks(torch.tensor([row.tokens]), fwd_hooks=zero_heads(heads) if heads else [])
                logp = torch.log_softmax(logits[0].double(), dim=-1)
                gold = sum(logp[first + k, t].item() for k, t in enumerate(ids))
                out.append(-gold / math.log(2) / len(item.continuations[0].encode("utf-8")))
        return sum(out) / len(out)

    task = load_task("gsm8k", n=2, seed=0)
    assert record["intact_bits_per_byte"] == pytest.approx(bits_per_byte([]), abs=1e-4)
    change = bits_per_byte(sets["AHON (LN)", 0]) - bits_per_byte([])
    assert table.loc["AHON (LN)", "bpb_change"] == pytest.approx(change, abs=1e-4)  # float32 forwards, two paths
    row = table.loc["AHON (LN)"]
    assert row["bpb_change_low"] <= row["bpb_change"] <= row["bpb_change_high"]


def test_steps_to_reach_interpolates_the_first_crossing():
    from lens_heads.growth import inheritune_comparisons as script

    h = [{"step": 0, "val_loss": 10.0}, {"step": 5, "train_loss": 9.0}, {"step": 10, "val_loss": 7.0},
         {"step": 20, "val_loss": 8.0}, {"step": 30, "val_loss": 6.0}]
    assert script.steps_to_reach(h, 7.5) == pytest.approx(10 * (10 - 7.5) / (10 - 7))  # first crossing, 0..10
    assert script.steps_to_reach(h, 7.0) == 10 and script.steps_to_reach(h, 10.0) == 0
    assert script.steps_to_reach(h, 6.5) == pytest.approx(20 + 10 * (8 - 6.5) / (8 - 6))
    assert np.isnan(script.steps_to_reach(h, 5.0))


@pytest.mark.slow
def test_inheritune_baselines_analysis_end_to_end(tmp_path):
    """Two seeds of a tiny run: every method is compared with Inheritune over seeds and over windows (each window's
    loss averaged over the seeds), the final losses are the runs' own, the speed-up is the geometric mean of the per-seed step ratios read from the
    histories, and a rerun reads everything back."""
    import json

    from lens_heads.growth import inheritune_comparisons as comparisons

    script = load_script("inheritune_baselines")
    argv = ["--seeds", "0,1", "--d-model", "16", "--heads", "2", "--ref-layers", "2", "--student-layers", "1",
            "--steps", "2", "--warmup", "1", "--eval-every", "1", "--eval-batches", "1", "--batch", "2", "--seq", "32",
            "--baselines", "hybrid_stacking,half_width,distill_logit", "--rank-inputs", "2", "--rank-len", "16",
            "--loss-windows", "3", "--eval-tasks", "arc_easy", "--eval-n", "2", "--n-resamples", "50",
            "--runs", str(tmp_path / "runs"), "--figures", str(tmp_path / "fig"), "--no-png", "--no-progress"]
    with pytest.raises(SystemExit):  # one seed leaves nothing to resample
        script.parse_args(["--seeds", "0"])
    argv[argv.index("--ref-layers") + 1], argv[argv.index("--student-layers") + 1] = "4", "2"
    methods = script.main(argv)
    result = json.loads((tmp_path / "fig" / "inheritune_baselines.json").read_text())
    assert set(methods["method"]) == {"reference (4L)", "Inheritune", "scratch 1x", "scratch 2x", "hybrid stacking",
                                      "half width", "distill logit"}  # half width: 8d, 1 head, reloaded as such
    stages = {s: {st["name"]: st for st in json.loads((tmp_path / "runs" / f"seed_{s}" / "result.json").read_text())
                  ["stages"]} for s in (0, 1)}
    for row in result["per_seed"]:
        assert row["val_loss"] == stages[row["seed"]][row["stage"]]["val_loss"]
    logit = methods.set_index("method").loc["distill logit"]
    assert logit["val_loss_mean"] == pytest.approx(np.mean([stages[s]["distill_logit_2L"]["val_loss"] for s in (0, 1)]))
    steps = []
    for s in (0, 1):
        inh, other = stages[s]["student_2L"], stages[s]["distill_logit_2L"]
        target = max(inh["val_loss"], other["val_loss"])
        steps.append((comparisons.steps_to_reach(other["history"], target),
                      comparisons.steps_to_reach(inh["history"], target)))
    if all(a > 0 and b > 0 for a, b in steps):  # the geometric mean of the per-seed ratios
        assert logit["speedup"] == pytest.approx(np.exp(np.mean([np.log(a / b) for a, b in steps])))
    else:  # a side already at the loss before its first step: no ratio, and the row says why
        row = next(t for t in result["convergence_tests"] if t["k"] == "distill logit")
        assert np.isnan(logit["speedup"]) and row["verdict"] == "not tested" and "unbounded" in row["test_note"]
    tests = result["final_loss_tests"]
    assert {t["unit"] for t in tests} == {"training seed", "validation window (mean over seeds)"}
    assert all(t["b"] == "Inheritune" and t["verdict"] for t in tests)
    assert {t["n"] for t in tests} == {2, 3}  # seeds; windows
    windows = {s: json.loads(next((tmp_path / "runs" / "extras").glob(f"seed_{s}_distill_logit_2L.json")).read_text())
               ["value"]["window_losses"] for s in (0, 1)}
    inh = {s: json.loads(next((tmp_path / "runs" / "extras").glob(f"seed_{s}_student_2L.json")).read_text())
           ["value"]["window_losses"] for s in (0, 1)}
    by_window = next(t for t in tests if t["k"] == "distill logit" and t["unit"].startswith("validation window"))
    expected = np.mean([np.mean(windows[s]) - np.mean(inh[s]) for s in (0, 1)])  # the mean of per-window differences
    assert by_window["difference"] == pytest.approx(expected)
    assert result["zero_shot_accuracy"] and result["stage_methods"]["distill logit"].startswith("fresh n layers")
    again = script.main(argv)  # from the runs and the cached measurements
    assert again["val_loss_mean"].tolist() == methods["val_loss_mean"].tolist()


def test_training_rerun_compares_each_curve_point_by_point(tmp_path):
    """A fine-tune record and a baselines run folder made by hand: the equal points are counted, the largest
    differences and the first differing step are the ones planted, a stage not made again is listed, and a run with
    other settings is refused."""
    import json

    script = load_script("training_rerun")
    figures, ft, runs = tmp_path / "figures", tmp_path / "ft", tmp_path / "runs" / "seed_0"
    for folder in (figures, ft, runs):
        folder.mkdir(parents=True)
    config = {"steps": 3, "lr": 5e-5}
    recorded_ft = {"config": config, "train_loss": [3.0, 2.0, 1.0], "eval_steps": [0, 3], "eval_loss": [4.0, 2.0]}
    (figures / "distributions_arc_easy.json").write_text(json.dumps({"finetune": recorded_ft}))
    (ft / "finetune.json").write_text(json.dumps({**recorded_ft, "train_loss": [3.0, 2.5, 1.0]}))
    history = [{"step": 0, "val_loss": 10.0}, {"step": 10, "val_loss": 8.0}]
    (figures / "inheritune_baselines.json").write_text(json.dumps({
        "settings": {}, "histories": {"0": {"Inheritune": history, "scratch 1x": history}},
        "per_seed": [{"seed": 0, "stage": "student_2L", "method": "Inheritune", "val_loss": 8.0, "tokens_seen": 64},
                     {"seed": 0, "stage": "scratch_2L_1x", "method": "scratch 1x", "val_loss": 8.0,
                      "tokens_seen": 64}]}))
    (runs / "stages.json").write_text(json.dumps([
        {"name": "student_2L", "steps": 10, "tokens_seen": 64, "val_loss": 8.0 + 2e-6,
         "history": [{"step": 0, "val_loss": 10.0}, {"step": 5, "train_loss": 9.0}, {"step": 10, "val_loss": 8.0 + 2e-6}]},
        {"name": "stack_source_1L", "steps": 10, "tokens_seen": 64, "val_loss": 9.0, "history": []}]))
    record = script.main(["--finetune", str(ft), "--baselines", str(tmp_path / "runs"), "--figures", str(figures)])
    train = record["finetune"]["train_loss"]
    assert (train["points"], train["equal"], train["first_differing_step"]) == (3, 2, 2)
    assert train["max_abs_difference"] == 0.5 and train["max_rel_difference"] == 0.25
    assert record["finetune"]["held_out_loss"]["equal"] == 2
    (stage,) = record["baselines"]["stages"]
    assert stage["method"] == "Inheritune" and stage["val_loss_history"]["equal"] == 1
    assert stage["val_loss_history"]["first_differing_step"] == 10
    assert stage["final_val_loss"]["max_rel_difference"] == pytest.approx(2e-6 / 8.0, rel=1e-6)  # float64 subtraction
    assert record["baselines"]["not_made_again"] == ["seed 0 scratch_2L_1x"]
    assert json.loads((figures / "training_rerun.json").read_text())["finetune"]["train_loss"] == train
    (ft / "finetune.json").write_text(json.dumps({**recorded_ft, "config": {"steps": 4, "lr": 5e-5}}))
    with pytest.raises(InputError, match="other settings"):
        script.main(["--finetune", str(ft), "--figures", str(figures)])


def test_training_rerun_code_pair_reads_a_finished_run_and_one_in_progress(tmp_path):
    """The old folder's finished result.json against the new folder's stages so far: a stage equal to the last bit
    and one with a planted difference; a stage only one side holds is not compared."""
    import json

    script = load_script("training_rerun")
    old, new = tmp_path / "old" / "seed_1", tmp_path / "new" / "seed_1"
    old.mkdir(parents=True)
    new.mkdir(parents=True)
    history = [{"step": 0, "val_loss": 10.0}, {"step": 2, "train_loss": 9.5}, {"step": 4, "val_loss": 9.0}]
    moved = [dict(h) for h in history]
    moved[2]["val_loss"] = 9.0 * (1 + 1e-7)
    (old / "result.json").write_text(json.dumps({"stages": [{"name": "a", "history": history},
                                                            {"name": "b", "history": history},
                                                            {"name": "c", "history": history}]}))
    (new / "stages.json").write_text(json.dumps([{"name": "a", "history": history}, {"name": "b", "history": moved}]))
    record = script.main(["--code-pair", f"{tmp_path / 'old'},{tmp_path / 'new'}", "--figures", str(tmp_path)])
    rows = {r["stage"]: r["val_loss_history"] for r in record["code_pair"]["stages"]}
    assert set(rows) == {"a", "b"} and rows["a"]["equal"] == 2 and rows["a"]["max_abs_difference"] == 0
    assert rows["b"]["equal"] == 1 and rows["b"]["first_differing_step"] == 4
    assert rows["b"]["max_rel_difference"] == pytest.approx(1e-7, rel=1e-6)  # float64 arithmetic on the planted value


def test_training_rerun_finetune_pair_compares_losses_and_weight_bytes(tmp_path):
    """Two hand-made fine-tune folders: equal losses but weights one byte apart read as equal curves and unequal
    weights; another config is refused."""
    import json

    script = load_script("training_rerun")
    rec = {"config": {"steps": 2}, "train_loss": [2.0, 1.0], "eval_steps": [0, 2], "eval_loss": [3.0, 2.0]}
    folders = [tmp_path / "old", tmp_path / "new"]
    for folder, weights in zip(folders, (b"\x00\x01", b"\x00\x02")):
        folder.mkdir()
        (folder / "finetune.json").write_text(json.dumps(rec))
        (folder / "model.safetensors").write_bytes(weights)
    argv = ["--finetune-pair", ",".join(map(str, folders)), "--figures", str(tmp_path)]
    pair = script.main(argv)["finetune_pair"]
    assert pair["train_loss"]["equal"] == 2 and pair["held_out_loss"]["equal"] == 2 and not pair["weights_equal"]
    (folders[1] / "finetune.json").write_text(json.dumps({**rec, "config": {"steps": 3}}))
    with pytest.raises(InputError, match="other settings"):
        script.main(argv)


@pytest.mark.slow
def test_inheritune_growth_preset_end_to_end(tmp_path):
    """The growth preset at tiny sizes: a reference trained longer than a stage, students grown, same-size scratch
    beside the final one; its own files, every seed's growth stages in the record, and the per-stage rank figure."""
    import json

    script = load_script("inheritune_baselines")
    argv = ["--preset", "growth", "--seeds", "0,1", "--d-model", "16", "--heads", "2", "--ref-layers", "4",
            "--student-layers", "1", "--grow-by", "1", "--max-layers", "3", "--steps", "2", "--ref-steps", "12",
            "--warmup", "1", "--eval-every", "1", "--eval-batches", "1", "--batch", "2", "--seq", "32",
            "--rank-inputs", "2", "--rank-len", "16", "--loss-windows", "3", "--eval-tasks", "arc_easy", "--eval-n",
            "2", "--n-resamples", "50", "--runs", str(tmp_path / "runs"), "--figures", str(tmp_path / "fig"),
            "--no-png", "--no-progress"]
    methods = script.main(argv)
    assert set(methods["method"]) == {"reference (4L)", "Inheritune", "scratch 1x", "scratch 2x"}
    record = json.loads((tmp_path / "fig" / "inheritune_growth.json").read_text())
    assert (tmp_path / "fig" / "inheritune_growth_rank_stages.html").exists()
    assert not (tmp_path / "fig" / "inheritune_baselines.json").exists()
    for seed in ("0", "1"):
        run = json.loads((tmp_path / "runs" / f"seed_{seed}" / "result.json").read_text())
        students = [s["name"] for s in run["stages"] if s["kind"] == "student"]
        assert [g["stage"] for g in record["growth"][seed]["stages"]] == students
        assert record["growth"][seed]["reference_steps"] == 12 and record["growth"][seed]["student_steps"] == 2
        assert run["stages"][0]["steps"] == 12
