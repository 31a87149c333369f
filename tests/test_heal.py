"""heal: pruned blocks, then continued training. Checked against plain Hugging Face models built in the test
(loss of the exported folder before healing, weights of the source model) and against explicit arithmetic
(tokens per step, argsort of the scores)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from lens_heads import InputError
from lens_heads.ablation.prune import prune
from lens_heads.experiments.healing import ARMS, heal, removal_arms, truncation
from lens_heads.experiments.layer_ranking import LayerScores
from lens_heads.training.config import TrainConfig
from lens_heads.training.corpus import TokenCorpus
from lens_heads.training.windows import eval_windows

VOCAB = 61


def llama_folder(path, n_layers: int = 4):
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                  num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=64)
    hf = AutoModelForCausalLM.from_config(config).eval()
    hf.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2").save_pretrained(path)
    return path


def corpus() -> TokenCorpus:
    """A learnable stream: a fixed cycle of 7 tokens, so the next token is predictable from the last."""
    cycle = np.array([3, 9, 14, 27, 33, 41, 58], dtype=np.uint16)
    return TokenCorpus(train=np.tile(cycle, 400), val=np.tile(cycle, 60), meta={"name": "cycle"})


CONFIG = TrainConfig(steps=12, batch_size=2, seq_len=16, lr=3e-3, min_lr=3e-4, warmup_steps=2, eval_every=6,
                     eval_batches=1, checkpoint_every=6, log_every=6)


def scores(n: int = 6, lazy=(3, 4)) -> LayerScores:
    rng = np.random.default_rng(1)
    arrays = {name: rng.random(n) for name in (
        "block_influence", "attention_influence", "max_rank", "mean_rank", "max_rank_averaged", "mean_rank_averaged",
        "ahon_mean", "ahon_ln_mean", "ahon_ln_zero_share")}
    return LayerScores(**arrays, lazy=np.isin(np.arange(n), lazy))


def test_healing_lowers_the_loss_of_a_pruned_model_on_a_fixed_batch(tmp_path):
    source = llama_folder(tmp_path / "source")
    batch = torch.from_numpy(np.asarray(corpus().val[:33], dtype=np.int64))[None]
    healed = heal(source, [1, 2], corpus(), CONFIG, out_dir=tmp_path / "arm", device="cpu", progress=False)
    plain = AutoModelForCausalLM.from_pretrained(healed.folder).eval()  # the pruned model before any step
    with torch.no_grad():
        before = F.cross_entropy(plain(batch[:, :-1]).logits[0].double(), batch[0, 1:]).item()
        after = F.cross_entropy(healed.model(batch[:, :-1])[0].double(), batch[0, 1:]).item()
    assert plain.config.num_hidden_layers == 2 and healed.model.cfg.n_layers == 2
    # the step-0 record is the unhealed model's validation loss: plain HF on the same windows agrees to float32
    # rounding (TransformerLens and transformers sum attention in different orders)
    windows = eval_windows(corpus().val, CONFIG.eval_batches * CONFIG.batch_size, CONFIG.seq_len)
    with torch.no_grad():
        logits = plain(windows[:, :-1]).logits.double()
    start = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert healed.result.history[0]["step"] == 0
    assert healed.result.history[0]["val_loss"] == pytest.approx(start, rel=1e-4)
    assert after < before - 1.0, (before, after)  # 12 steps on a 7-token cycle: 4.1 nats to about 2.9


def test_inheritune_truncation_keeps_exactly_the_first_layers_weights(tmp_path):
    source = llama_folder(tmp_path / "source", n_layers=5)
    assert truncation(5, 3) == (3, 4)
    original = AutoModelForCausalLM.from_pretrained(source).state_dict()
    kept = prune(source, layers=truncation(5, 3), part="block").save(tmp_path / "first3")
    truncated = AutoModelForCausalLM.from_pretrained(kept).state_dict()
    assert AutoModelForCausalLM.from_pretrained(kept).config.num_hidden_layers == 3
    expected = {k: v for k, v in original.items() if not k.startswith("model.layers.")
                or int(k.split(".")[2]) < 3}
    assert truncated.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(truncated[key], value), key


def test_every_arm_gets_the_same_steps_tokens_and_size(tmp_path):
    source = llama_folder(tmp_path / "source", n_layers=6)
    arms = removal_arms(scores(), seed=0)
    budgets = {}
    for name, removed in arms.items():
        healed = heal(source, removed, corpus(), CONFIG, out_dir=tmp_path / name, device="cpu", progress=False)
        budgets[name] = healed.budget()
    tokens = CONFIG.steps * CONFIG.batch_size * CONFIG.seq_len  # every step is one batch of seq_len windows
    assert all(b == {"steps": CONFIG.steps, "tokens_seen": tokens, "n_params": budgets["lazy"]["n_params"],
                     "n_layers": 4} for b in budgets.values()), budgets
    again = heal(source, arms["lazy"], corpus(), CONFIG, out_dir=tmp_path / "lazy", device="cpu", progress=False)
    assert again.result.history == heal(source, arms["lazy"], corpus(), CONFIG, out_dir=tmp_path / "lazy",
                                        device="cpu", progress=False).result.history  # a finished arm reloads


def test_removal_arms_follow_the_scores():
    s = scores(lazy=(1, 3, 4))
    arms = removal_arms(s, 2, seed=3)
    assert tuple(arms) == ARMS
    bi = s.block_influence
    lazy = [1, 3, 4]
    assert arms["lazy"] == tuple(sorted(sorted(lazy, key=lambda i: bi[i])[:2]))
    assert arms["block_influence"] == tuple(sorted(np.argsort(bi)[:2].tolist()))
    assert arms["inheritune"] == (4, 5)
    assert len(set(arms["random"])) == 2 and arms["random"] == removal_arms(s, 2, seed=3)["random"]
    assert removal_arms(scores(lazy=(3, 4)))["lazy"] == (3, 4)  # k defaults to the number of lazy layers


@pytest.mark.parametrize("bad", [dict(k=4), dict(k=0), dict(k=6)])
def test_bad_arms_are_refused(bad):
    with pytest.raises(InputError):
        removal_arms(scores(lazy=(3, 4)), **bad)


def test_a_folder_of_other_blocks_is_refused(tmp_path):
    source = llama_folder(tmp_path / "source")
    heal(source, [1], corpus(), CONFIG, out_dir=tmp_path / "arm", device="cpu", progress=False)
    with pytest.raises(InputError, match="other blocks"):
        heal(source, [2], corpus(), CONFIG, out_dir=tmp_path / "arm", device="cpu", progress=False)
    with pytest.raises(InputError):
        truncation(4, 4)


@pytest.mark.slow
def test_heal_analysis_end_to_end_and_resumed(tmp_path, monkeypatch):
    """The analysis on a tiny folder (corpus: the 7-token cycle): every arm's budget equal, each accuracy test's
    difference the difference of the two arms' accuracies, and a second run reading every arm back unchanged."""
    import json

    from conftest import load_script

    script = load_script("heal")
    monkeypatch.setattr(script, "load_corpus", lambda *a, **k: corpus())
    folder = llama_folder(tmp_path / "tiny", n_layers=5)
    figures = tmp_path / "figures"
    figures.mkdir()
    layers = scores(5, lazy=(2, 3)).to_dict()
    (figures / f"layers_{script.recorded_name(str(folder), 'arc_easy')}.json").write_text(
        json.dumps({"layer_scores": layers}))
    argv = ["--model", str(folder), "--n", "6", "--seeds", "0,1", "--steps", "4", "--batch-size", "2", "--seq-len",
            "16", "--warmup-steps", "1", "--eval-every", "2", "--eval-batches", "1", "--windows", "6", "--out",
            str(tmp_path / "runs"), "--figures", str(figures), "--no-png"]
    script.main(argv)
    path = next(figures.glob("heal_*.json"))
    first = json.loads(path.read_text())
    budget = {(r["budget_steps"], r["budget_tokens_seen"], r["budget_n_params"]) for r in first["table"]}
    assert len(budget) == 1 and next(iter(budget))[:2] == (4, 4 * 2 * 16)  # steps, steps x batch x seq_len
    assert {a: v["inheritune"] for a, v in first["arms"].items()} == {"0": [3, 4], "1": [3, 4]}
    for t in first["tests"]:
        if t["metric"] == "accuracy":
            s = first["summary"]
            assert t["difference"] == pytest.approx(s[t["a"]]["accuracy"] - s["inheritune"]["accuracy"])
    script.main(argv)
    again = json.loads(path.read_text())
    assert again["table"] == first["table"] and again["tests"] == first["tests"]
