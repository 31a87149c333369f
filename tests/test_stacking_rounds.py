"""Two rounds of stacking (the authors' ``*_stacking_2rnd`` baseline): which trained block lands where, that the
second round starts from the first round's trained weights, and its FLOPs counted by hand."""

import torch

import lens_heads.growth.inheritune_run as inheritune_run
from lens_heads.growth.inherit import stack
from lens_heads.growth.inheritune_config import InherituneConfig
from lens_heads.growth.inheritune_run import planned_stages, run_inheritune
from lens_heads.training.checkpoints import load_model_state
from test_inheritune import VOCAB, corpus, perturbed, tiny_gpt2, tiny_train_config  # noqa: F401 (corpus: fixture)


def blocks_of(model) -> dict[int, dict[str, torch.Tensor]]:
    """Each block's tensors by block index and name within the block."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("blocks."):
            _, layer, rest = name.split(".", 2)
            out.setdefault(int(layer), {})[rest] = tensor
    return out


def test_two_rounds_copy_the_trained_blocks_where_stacking_puts_them():
    source = perturbed(tiny_gpt2(1, seed=0), seed=1)  # a quarter of the final depth, trained
    round1 = stack(source, 2, seed=2)
    src, r1 = blocks_of(source), blocks_of(round1)
    for layer in (0, 1):  # round 1: the one trained block, twice
        assert r1[layer].keys() == src[0].keys()
        assert all(torch.equal(r1[layer][k], src[0][k]) for k in src[0]), layer
    trained = perturbed(round1, seed=3)  # round 1's training moves its two copies apart
    t1 = blocks_of(trained)
    assert not torch.equal(t1[0]["attn.W_Q"], t1[1]["attn.W_Q"])
    final = stack(trained, 4, seed=4)
    fin = blocks_of(final)
    for layer, from_block in {0: 0, 1: 1, 2: 0, 3: 1}.items():  # round 2: the trained two repeated
        assert all(torch.equal(fin[layer][k], t1[from_block][k]) for k in t1[from_block]), layer
    for name in ("embed.W_E", "pos_embed.W_pos", "ln_final.w"):  # the rest: the trained round 1's
        assert torch.equal(final.state_dict()[name], trained.state_dict()[name]), name


# FLOPs of one training token of a GPT-2 with d_model 32, 2 heads of 16, MLP 128, vocabulary 101, in windows of 16,
# counted by hand (2 FLOPs a multiply-add, backward twice the forward):
# a block: Q, K, V, O projections 4 x 32 x 32, MLP 2 x 32 x 128 multiply-adds, attention 2 x 2 x 16 x (16 + 1)
PER_BLOCK = 2 * 4 * 32 * 32 + 2 * 2 * 32 * 128 + 2 * 2 * 16 * 17  # 8192 + 16384 + 1088 = 25664
UNEMBED = 2 * 32 * VOCAB  # 6464
TOKENS = 4 * 4 * 16  # 4 steps of 4 windows of 16


def hand_flops(n_layers: int) -> int:
    return 3 * TOKENS * (n_layers * PER_BLOCK + UNEMBED)


def two_round_config(**kw) -> InherituneConfig:
    return InherituneConfig(**{**dict(ref_layers=4, student_layers=4, max_layers=4, d_model=32, n_heads=2, n_ctx=32,
                                      d_vocab=VOCAB, train_config=tiny_train_config(steps=4, eval_every=2), rank_inputs=2,
                                      rank_len=16, seed=0, baselines=False, ablations=("stacking_2rnd",)), **kw})


def test_two_round_stacking_stage_chain_and_flops(corpus, tmp_path, monkeypatch):  # noqa: F811 (fixture)
    stacked_from: list[dict[str, torch.Tensor]] = []

    def spy(source, n_layers, *, seed=0):
        stacked_from.append({k: v.clone() for k, v in source.state_dict().items()})
        return stack(source, n_layers, seed=seed)

    monkeypatch.setattr(inheritune_run, "stack", spy)
    result = run_inheritune(two_round_config(), corpus, out_dir=tmp_path, progress=False)
    names = [s.name for s in result.stages]
    assert names == ["reference_4L", "student_4L", "stack_source_1L", "stacking_round1_2L", "stacking_2rnd_4L"]
    source, round1, final = (result.stage(n) for n in names[2:])
    assert (source.n_layers, round1.n_layers, final.n_layers) == (1, 2, 4)
    assert (source.kind, round1.kind, final.kind) == ("stack_source", "stack_source", "ablation")
    assert final.built_from == ["stacking_round1_2L"] and round1.built_from == ["stack_source_1L"]

    # round 2 stacks round 1 as trained (its saved final weights), not round 1 as stacked
    trained1 = tiny_gpt2(2)
    load_model_state(trained1, tmp_path / "stacking_round1_2L" / "final" / "model.safetensors")
    assert len(stacked_from) == 2
    second = stacked_from[1]
    assert all(torch.equal(second[k], v) for k, v in trained1.state_dict().items())
    assert not torch.equal(second["blocks.0.attn.W_Q"], second["blocks.1.attn.W_Q"])  # trained apart

    budget = result.budget(final)
    assert budget["train_flops"] == hand_flops(4) == 83_804_160
    assert budget["source_flops"] == hand_flops(1) + hand_flops(2) == 69_058_560
    assert budget["total_flops"] == 152_862_720
    # the plan counts the same stages before anything runs
    plan = planned_stages(two_round_config()).set_index("stage")
    for name, depth in (("stack_source_1L", 1), ("stacking_round1_2L", 2), ("stacking_2rnd_4L", 4)):
        assert plan.loc[name, "flops"] == hand_flops(depth), name


def test_two_rounds_need_a_quarter_depth():
    plan = planned_stages(two_round_config(ref_layers=3, student_layers=3, max_layers=3))
    assert not any(plan["stage"].str.startswith("stack")), "3 layers have no quarter: the baseline is skipped"
