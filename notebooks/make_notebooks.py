"""Write the four notebooks of ``notebooks/`` from the cells below (the .ipynb files are generated: edit here).

    python notebooks/make_notebooks.py

Each notebook calls the library only, runs top to bottom in a fresh kernel in a few minutes on 2 CPU cores, and is
executed by ``tests/test_notebooks.py``.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from lens_heads.plumbing.io import atomic_write_text

HERE = Path(__file__).resolve().parent

INACTIVE_HEADS = [
    new_markdown_cell("""# Inactive attention heads in SmolLM2-135M

Sandoval-Segura et al. score every attention head with twelve cheap statistics of its attention pattern, value
vectors and output (AWFT, AEQD, FTVVN, AVVN, LTHON, AHON and their layer-normalised variants), then zero the heads a
score calls inactive and watch the accuracy. This notebook does the same at toy scale on the embedded
SmolLM2-135M-Instruct (no network needed): score heads on ARC-Easy prompts, look at the scores, read thresholds, and
zero heads per input against a random baseline on the same items."""),
    new_code_cell("""import torch
import lens_heads
from lens_heads import (evaluate, load_model, load_task, paired_difference, random_zeroing, score_heads,
                        threshold_zeroing, thresholds)
from lens_heads.viz.score_figures import score_heatmaps
from lens_heads.heads.distributions import layer_summary

torch.manual_seed(0)
model = load_model()  # raw weight basis: the norms the scores read are not changed by weight processing
print(lens_heads.weight_basis(model), model.cfg.n_layers, "layers x", model.cfg.n_heads, "heads")"""),
    new_markdown_cell("## Score every head on a small ARC-Easy sample\nOne forward pass per batch; no activation cache."),
    new_code_cell("""task = load_task("arc_easy", n=16, seed=0)
scores = score_heads(model, task, batch_size=8)
scores.values.shape  # [input, layer, head, score]"""),
    new_code_cell("""mean = {name: scores.mean(name).numpy() for name in scores.names}
score_heatmaps(mean, scores.direction, title="Mean head scores on 16 ARC-Easy prompts (dark = inactive side)")"""),
    new_code_cell("""summary = layer_summary(scores, ["AHON (LN)"])
summary[["layer", "mean", "q05", "q50", "q95"]].head(10)"""),
    new_markdown_cell("""## Zero heads per input, against random zeroing

The threshold comes from the pooled (input, layer, head) distribution of the unablated scores. Inside each forward
pass, a head whose AHON (LN) for THAT input falls below it gets its output z set to 0 before W_O. Random zeroing
removes each (input, layer, head) with the same probability. Both are compared with the unablated run on the same
items (paired differences), with the gold answer's log-probability as a low-variance companion."""),
    new_code_cell("""eval_task = load_task("arc_easy", n=12, seed=1)
base = evaluate(model, eval_task, progress=False)
t = thresholds(scores, "AHON (LN)", [0.2])[0.2]
by_score = threshold_zeroing(model, "AHON (LN)", t)
ablated = evaluate(model, eval_task, hooks=[by_score], progress=False)
by_chance = random_zeroing(model, by_score.share_zeroed(), seed=0)
random = evaluate(model, eval_task, hooks=[by_chance], progress=False)
print(f"baseline {base.accuracy:.1%} (chance {base.chance:.1%})")
for label, result, z in [("AHON (LN)", ablated, by_score), ("random", random, by_chance)]:
    d = paired_difference(result, base)
    print(f"{label:10s} zeroed {z.share_zeroed():.1%} of heads: accuracy {result.accuracy:.1%}, "
          f"paired diff {d.mean:+.3f} (95% CI {d.ci95[0]:+.3f}..{d.ci95[1]:+.3f}), "
          f"gold log-prob change {d.gold_logprob_change.mean:+.3f}")"""),
    new_markdown_cell("""With 12 items one accuracy point is far inside the noise: the paired gold log-prob change is the number to
watch. `python -m lens_heads.report` runs the full sweep (every score, several fractions) with the same library
calls and writes the figures and tables."""),
]

RANK_INHERITUNE = [
    new_markdown_cell("""# Attention rank collapse and Inheritune, at toy scale

Sanyal et al. find that the deep layers of GPT-2 models attend in a degenerate way: their attention matrices have
(near) rank one ("lazy layers"). Inheritune builds a smaller model from the first, still potent layers of a larger
one, trains it, and grows it while it is worse than the reference. Here: the rank measure on hand-made matrices, the
rank profile of the embedded SmolLM2, and an Inheritune run on a tiny GPT-2 trained for a few dozen steps on the
offline State of the Union corpus."""),
    new_code_cell("""import torch
from lens_heads import load_model
from lens_heads.collapse.rank import approx_rank, attention_rank
from lens_heads.training.corpus import load_corpus, gpt2_tokenizer
from lens_heads.growth.inheritune_config import InherituneConfig
from lens_heads.growth.inheritune_run import run_inheritune
from lens_heads.training.config import TrainConfig
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
GPT-2 is the authors' (`lens_heads.growth.gpt2.GPT2Options`). Sixteen steps of 4 x 32 tokens each: nothing is learnt or collapses at this
scale; the point is the procedure (`analyses/inheritune.py` runs it for real)."""),
    new_code_cell("""import tempfile
corpus = load_corpus("sotu")
config = InherituneConfig(ref_layers=4, student_layers=2, grow_by=1, max_layers=3, d_model=64, n_heads=4, n_ctx=32,
                          train=TrainConfig(steps=16, batch_size=4, seq_len=32, warmup_steps=2, eval_every=8,
                                            eval_batches=1, checkpoint_every=16, log_every=4),
                          rank_inputs=4, rank_len=32, ablations=(), seed=0)
result = run_inheritune(config, corpus, out_dir=tempfile.mkdtemp(), tokenizer=gpt2_tokenizer(), progress=False)
result.to_dataframe()[["stage", "n_layers", "steps", "tokens_seen", "val_loss", "val_loss_minus_reference",
                       "mean_max_rank", "n_lazy_layers"]]"""),
    new_code_cell("""for stage in result.stages:
    print(f"{stage.name:16s} max rank per layer {[round(r, 1) for r in stage.rank['max_rank']]}")"""),
]

ATTENTION_PATTERNS = [
    new_markdown_cell("""# Attention patterns in the head explorer

Which heads look inactive, and what do they attend to? `lens_heads.explore` draws every head of SmolLM2-135M as a
[layer x head] map of any score; click a head to see its attention pattern on each prompt (the model's own tokens),
its score per prompt, its rank among the heads and its layer's attention rank. Everything is inlined, so this works
offline, here and in the saved page."""),
    new_code_cell("""import lens_heads as lh
from lens_heads.heads.scores import most_inactive

model = lh.load_model()
prompts = ["When Mary and John went to the store, John gave a drink to",
           "The capital of France is Paris, and the capital of Italy is",
           "<b>Tokens with markup</b> such as <bos> stay text: def add(a, b): return a + b"]
explorer = lh.explore(model, prompts, score="AHON (LN)")
explorer"""),
    new_markdown_cell("""The same numbers without the view: the three heads AHON (LN) calls least active (mean over the prompts),
and how much of each one's attention goes to the first token on the first prompt. Least-active heads typically put
almost all their attention there (an attention sink) and write little."""),
    new_code_cell("""scores = lh.score_heads(model, prompts, progress=False)
least = most_inactive(scores.mean("AHON (LN)"), scores.direction["AHON (LN)"], 3)
{f"L{l}H{h}": round(float(explorer.pattern(0, l, h)[1:, 0].mean()), 3) for l, h in least}"""),
    new_code_cell("""explorer.save("explorer.html")  # a standalone page: open it in any browser, no server needed"""),
]

EXPLORER_EFFECTS_TASK = [
    new_markdown_cell("""# Your own data: a custom task, head effects and the explorer

Bring multiple-choice items in lm-eval's shape (`context`, `choices`, `gold`; optional `id` and `fewshot`) as
records, a JSON Lines file or a Hugging Face `datasets.Dataset`; evaluate the model on them, measure what removing
each head does (attribution patching: one forward and backward pass per batch), and explore the heads with those
effects beside the twelve scores. `python -m lens_heads.report --task-file items.jsonl` puts the same items in
the report."""),
    new_code_cell("""import json
import lens_heads as lh

records = [
    {"id": "fr", "context": "Question: What is the capital of France?\\nAnswer:", "choices": ["Paris", "Rome", "Berlin"], "gold": 0},
    {"id": "it", "context": "Question: What is the capital of Italy?\\nAnswer:", "choices": ["Madrid", "Rome", "Oslo"], "gold": 1},
    {"id": "de", "context": "Question: What is the capital of Germany?\\nAnswer:", "choices": ["Berlin", "Paris", "Lima"], "gold": "Berlin"},
    {"id": "es", "context": "Question: What is the capital of Spain?\\nAnswer:", "choices": ["Lisbon", "Madrid", "Vienna"], "gold": 1},
    {"id": "jp", "context": "Question: What is the capital of Japan?\\nAnswer:", "choices": ["Tokyo", "Seoul", "Beijing"], "gold": 0},
    {"id": "ca", "context": "Question: What is the capital of Canada?\\nAnswer:", "choices": ["Toronto", "Ottawa", "Quebec"], "gold": 1},
]
with open("capitals.jsonl", "w") as f:
    f.write("\\n".join(json.dumps(r) for r in records) + "\\n")
task = lh.load_task("capitals.jsonl")            # or lh.task_from_records(records, name="capitals")
assert task.items == lh.task_from_records(records, name="capitals").items
task.items[0]"""),
    new_markdown_cell("A malformed item is refused with its line and field:"),
    new_code_cell("""with open("broken.jsonl", "w") as f:
    f.write(json.dumps(records[0]) + "\\n" + json.dumps({"context": "Question: 2 + 2?\\nAnswer:", "choices": ["4"], "gold": 3}) + "\\n")
try:
    lh.load_task("broken.jsonl")
except lh.TaskFileError as e:
    print(e)"""),
    new_code_cell("""model = lh.load_model()
base = lh.evaluate(model, task, progress=False)
print(f"accuracy {base.accuracy:.1%} (n={base.n}, chance {base.chance:.1%})")
effects = lh.head_effects(model, task, method="attribution", metric="kl", progress=False)
effects.to_dataframe().sort_values("size", ascending=False).head()"""),
    new_markdown_cell("""The explorer on the task's prompts: the heatmap's scores are means over the task's rows, and the menu's last
entry colours the heads by their measured effect (dark = small). Click a head for its pattern, scores, ranks and
effect."""),
    new_code_cell("""scores = lh.score_heads(model, task, progress=False)
lh.explore(model, task, scores=scores, effects=effects, max_prompts=3)"""),
]

NOTEBOOKS = {
    "01_inactive_heads.ipynb": INACTIVE_HEADS,
    "02_rank_collapse_inheritune.ipynb": RANK_INHERITUNE,
    "03_attention_patterns.ipynb": ATTENTION_PATTERNS,
    "04_explorer_effects_custom_task.ipynb": EXPLORER_EFFECTS_TASK,
}


def write_all(folder: Path = HERE) -> list[Path]:
    paths = []
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(cells=cells, metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"}})
        for i, cell in enumerate(nb.cells):  # stable ids: regenerating gives the same file
            cell.id = f"{Path(name).stem[:2]}-{i:02d}"
        nbformat.validate(nb)
        path = folder / name
        atomic_write_text(path, nbformat.writes(nb))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write_all():
        print(p)
