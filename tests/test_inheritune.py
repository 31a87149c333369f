"""Inheritune and the training loop on tiny GPT-2 configs: what is copied, what stays fresh, exact resumption."""

import os
import signal

import numpy as np
import pytest
import torch

from lens_heads.collapse.rank_tracker import RankTracker
from lens_heads.growth.gpt2 import GPT2Options, gpt2_config, gpt2_model
from lens_heads.growth.inherit import grow, inherit, inherit_later_layers, stack
from lens_heads.growth.inheritune_config import InherituneConfig
from lens_heads.growth.inheritune_run import run_inheritune
from lens_heads.training.config import TrainConfig
from lens_heads.training.corpus import TokenCorpus
from lens_heads.training.loop import train

VOCAB = 101


def tiny_gpt2(n_layers=4, seed=0, options=GPT2Options()):
    return gpt2_model(gpt2_config(n_layers, d_model=32, n_heads=2, n_ctx=32, d_vocab=VOCAB), seed=seed, options=options)


def perturbed(model, seed):
    """Every parameter moved off its initial value, as training would (LayerNorms included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    return model


def params(model):
    return dict(model.named_parameters())


def copied_names(n_layers, all_names):
    """Spelled out from the paper: token embedding, blocks 0..n-1 (attn, MLP, ln1, ln2), unembedding."""
    return {k for k in all_names if k in ("embed.W_E", "unembed.W_U", "unembed.b_U")
            or any(k.startswith(f"blocks.{l}.") for l in range(n_layers))}


def state(model):
    return model.state_dict()


@pytest.fixture
def corpus():
    rng = np.random.default_rng(0)
    # a learnable stream: a fixed random sequence of 50 tokens, repeated
    motif = rng.integers(0, VOCAB, 50)
    return TokenCorpus(train=np.tile(motif, 100).astype(np.uint16), val=np.tile(motif, 10).astype(np.uint16),
                       meta={"name": "repeated motif"})


@pytest.mark.parametrize("options", [GPT2Options(), GPT2Options.transformer_lens()], ids=["authors", "tl"])
def test_inherit_copies_exactly_the_named_tensors(options):
    reference = perturbed(tiny_gpt2(4, seed=0, options=options), seed=1)
    student = inherit(reference, 2, seed=7)
    fresh = tiny_gpt2(2, seed=7, options=options)  # what a fresh init with the student's seed looks like
    ref, stu, new = state(reference), state(student), state(fresh)
    assert student.cfg.n_layers == 2 and set(stu) == set(new)
    copied = copied_names(2, stu)
    assert {"embed.W_E", "blocks.1.attn.W_Q", "blocks.1.ln2.w", "blocks.0.mlp.b_out"} <= copied
    for name, tensor in stu.items():
        if name in copied:
            assert torch.equal(tensor, ref[name]), name
        else:  # position embedding and final LayerNorm
            assert torch.equal(tensor, new[name]), name
            assert not torch.equal(tensor, ref[name]), name
    assert set(stu) - copied == {"pos_embed.W_pos", "ln_final.w", "ln_final.b"}
    # the unembedding: a tensor of its own (copied above), or the transpose of the copied token embedding
    assert ("unembed.W_U" in stu) == (not options.tie_embeddings)
    assert torch.equal(student.unembed.W_U, reference.unembed.W_U)


def test_inherit_later_layers_takes_the_last_blocks():
    reference = perturbed(tiny_gpt2(5, seed=0), seed=1)
    student = inherit_later_layers(reference, 2, seed=3)
    ref, stu, new = state(reference), state(student), state(tiny_gpt2(2, seed=3))
    for name, tensor in stu.items():
        if name.startswith("blocks."):
            layer, rest = name.split(".", 2)[1:]
            assert torch.equal(tensor, ref[f"blocks.{int(layer) + 3}.{rest}"]), name  # 0 <- 3, 1 <- 4
        elif name in ("embed.W_E", "unembed.b_U"):
            assert torch.equal(tensor, ref[name]), name
        else:
            assert torch.equal(tensor, new[name]), name


@pytest.mark.parametrize("parts, taken", [("attention", ("ln1.", "attn.")), ("mlp", ("ln2.", "mlp."))])
def test_inherit_one_sublayer(parts, taken):
    reference = perturbed(tiny_gpt2(3, seed=0), seed=1)
    student = inherit(reference, 2, seed=5, parts=parts)
    ref, stu, new = state(reference), state(student), state(tiny_gpt2(2, seed=5))
    n_taken = 0
    for name, tensor in stu.items():
        if name.startswith("blocks.") and name.split(".", 2)[2].startswith(taken) or name in ("embed.W_E", "unembed.b_U"):
            assert torch.equal(tensor, ref[name]), name
            n_taken += 1
        else:  # the other sub-layer of each block stays at fresh init
            assert torch.equal(tensor, new[name]), name
    assert n_taken > 2


def test_stack_repeats_the_trained_blocks():
    source = perturbed(tiny_gpt2(2, seed=0), seed=1)
    stacked = stack(source, 5, seed=2)
    src, stk = state(source), state(stacked)
    assert stacked.cfg.n_layers == 5
    for name, tensor in stk.items():
        if name.startswith("blocks."):
            layer, rest = name.split(".", 2)[1:]
            assert torch.equal(tensor, src[f"blocks.{int(layer) % 2}.{rest}"]), name
        else:  # embeddings and final LayerNorm: the source's
            assert torch.equal(tensor, src[name]), name


def test_bad_depths_are_refused_naming_the_limit():
    reference = tiny_gpt2(4)
    with pytest.raises(ValueError, match=r"1\.\.4"):
        inherit(reference, 5)
    with pytest.raises(ValueError, match=r"1\.\.4.*growing cannot pass"):
        grow(reference, 6)
    with pytest.raises(ValueError, match="exceed the source's 4 layers"):
        stack(reference, 4)
    with pytest.raises(ValueError, match="layers must name 2 reference blocks in 0..3"):
        inherit(reference, 2, layers=[0, 4])
    with pytest.raises(ValueError, match="max_layers=9.*8 layers"):
        run_inheritune(InherituneConfig(ref_layers=8, max_layers=9), None, out_dir="unused")
    with pytest.raises(ValueError, match="grow_by=0 must be at least 1"):  # it looped forever
        run_inheritune(InherituneConfig(grow_by=0), None, out_dir="unused")
    with pytest.raises(ValueError, match=r"grow_from='students' must be one of \('student', 'reference'\)"):
        run_inheritune(InherituneConfig(grow_from="students"), None, out_dir="unused")
    from lens_heads.collapse.rank_tracker import RankTracker
    from lens_heads.training.config import TrainConfig

    with pytest.raises(ValueError, match="log_every=0"):  # it divided by zero at the first step
        TrainConfig(log_every=0)
    with pytest.raises(ValueError, match="every=0"):
        RankTracker(torch.zeros(1, 4, dtype=torch.long), every=0)


def test_inherit_does_not_touch_global_rng_or_reference():
    reference = perturbed(tiny_gpt2(3, seed=0), seed=1)
    before = {k: v.clone() for k, v in params(reference).items()}
    torch.manual_seed(123)
    np.random.seed(123)
    expected_next = torch.rand(3), np.random.rand(3)
    torch.manual_seed(123)
    np.random.seed(123)
    inherit(reference, 2, seed=5)
    assert torch.equal(torch.rand(3), expected_next[0])
    assert np.array_equal(np.random.rand(3), expected_next[1])
    assert all(torch.equal(before[k], v) for k, v in params(reference).items())


def test_grow_keeps_inherited_blocks():
    reference = perturbed(tiny_gpt2(4, seed=0), seed=1)
    ref, gro = state(reference), state(grow(reference, 3, seed=9))  # fresh re-inheritance of three layers
    for name in copied_names(3, gro):
        assert torch.equal(gro[name], ref[name]), name

    student = perturbed(inherit(reference, 2, seed=4), seed=2)  # a "trained" 2-layer student
    grown = grow(reference, 4, student=student, seed=9)
    stu, gro = state(student), state(grown)
    for name, tensor in gro.items():
        if name.startswith(("blocks.2.", "blocks.3.")):
            assert torch.equal(tensor, ref[name]), name  # new layers come from the reference
        else:
            assert torch.equal(tensor, stu[name]), name  # everything the student had is kept
    with pytest.raises(ValueError, match="fewer layers"):
        grow(reference, 2, student=student)


def tiny_train_config(**kw):
    """A few steps of tiny batches, evaluated and checkpointed often; ``kw`` overrides any setting."""
    return TrainConfig(**{**dict(steps=6, batch_size=4, seq_len=16, warmup_steps=2, eval_every=3, eval_batches=1,
                                 checkpoint_every=3, log_every=1, lr=3e-3, seed=11), **kw})


def test_resumed_training_ends_at_the_same_weights(corpus, tmp_path):
    uninterrupted = tiny_gpt2(2, seed=3)
    result = train(uninterrupted, corpus, tiny_train_config(), out_dir=tmp_path / "a", progress=False)

    class Interrupt(Exception):
        pass

    def interrupt_after_checkpoint(model, step):
        if step == 4:  # step 3 was checkpointed; step 4's update is lost
            raise Interrupt

    first = tiny_gpt2(2, seed=3)
    with pytest.raises(Interrupt):
        train(first, corpus, tiny_train_config(), out_dir=tmp_path / "b", callbacks=[interrupt_after_checkpoint],
              progress=False)
    resumed = tiny_gpt2(2, seed=3)  # a new process: fresh model, state only from the checkpoint
    again = train(resumed, corpus, tiny_train_config(), out_dir=tmp_path / "b", progress=False)

    for (name, a), (_, b) in zip(uninterrupted.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), name
    assert again.val_loss == result.val_loss and again.tokens_seen == result.tokens_seen == 6 * 4 * 16
    # the run really trained: weights moved and the validation loss fell
    assert result.history[-1]["val_loss"] < result.history[0]["val_loss"]
    assert not torch.equal(params(uninterrupted)["blocks.0.attn.W_Q"], params(tiny_gpt2(2, seed=3))["blocks.0.attn.W_Q"])


def test_sigterm_mid_training_checkpoints_that_step_exits_143_and_the_rerun_ends_at_the_same_weights(
        corpus, tmp_path, capsys):
    """SIGTERM during step 2 (checkpoints fall every 3): the step finishes and is checkpointed, the run exits 143
    saying where; the rerun resumes from step 2 and ends bit-identical to an uninterrupted run."""
    uninterrupted = tiny_gpt2(2, seed=3)
    result = train(uninterrupted, corpus, tiny_train_config(), out_dir=tmp_path / "a", progress=False)

    def sigterm_at_step_2(model, step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the loop is between its update and checkpoint

    with pytest.raises(SystemExit) as stopped:
        train(tiny_gpt2(2, seed=3), corpus, tiny_train_config(), out_dir=tmp_path / "b",
              callbacks=[sigterm_at_step_2], progress=False)
    assert stopped.value.code == 143
    assert f"train stopped by SIGTERM (exit 143): every finished unit is kept in {tmp_path / 'b'}" in \
        capsys.readouterr().err
    assert [p.name for p in (tmp_path / "b" / "checkpoints").glob("step_*")] == ["step_0000002"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back
    resumed = tiny_gpt2(2, seed=3)
    again = train(resumed, corpus, tiny_train_config(), out_dir=tmp_path / "b", progress=False)
    for (name, a), (_, b) in zip(uninterrupted.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), name
    timeless = [[{k: v for k, v in r.items() if k != "wall_time_s"} for r in res.history] for res in (again, result)]
    assert again.val_loss == result.val_loss and timeless[0] == timeless[1]


def test_finished_run_reloads_and_other_settings_are_refused(corpus, tmp_path):
    model = tiny_gpt2(2, seed=3)
    train(model, corpus, tiny_train_config(), out_dir=tmp_path, progress=False)
    assert not (tmp_path / "checkpoints").exists()  # the final weights replace them
    reloaded = tiny_gpt2(2, seed=3)
    train(reloaded, corpus, tiny_train_config(), out_dir=tmp_path, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reloaded.parameters()))
    with pytest.raises(ValueError, match="another configuration.*differs in train"):
        train(tiny_gpt2(2, seed=3), corpus, tiny_train_config(lr=1e-3), out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="another configuration.*differs in model"):  # same settings, other shape
        train(tiny_gpt2(3, seed=3), corpus, tiny_train_config(), out_dir=tmp_path, progress=False)


def test_data_order_depends_on_seed_and_step_only(corpus):
    from lens_heads.training.windows import batch_at

    cfg = tiny_train_config()
    assert torch.equal(batch_at(corpus.train, 5, 0, cfg), batch_at(corpus.train, 5, 0, cfg))
    assert not torch.equal(batch_at(corpus.train, 5, 0, cfg), batch_at(corpus.train, 6, 0, cfg))
    assert not torch.equal(batch_at(corpus.train, 5, 0, cfg), batch_at(corpus.train, 5, 0, tiny_train_config(seed=12)))


def test_rank_tracker_logs_every_layer(corpus):
    tokens = torch.from_numpy(corpus.val[:32].astype(np.int64)).reshape(2, 16)
    result = train(tiny_gpt2(2, seed=0), corpus, tiny_train_config(), callbacks=[RankTracker(tokens, every=3)],
                   progress=False)
    tracked = [h for h in result.history if "max_rank" in h]
    assert [h["step"] for h in tracked] == [0, 3, 6]
    assert all(len(h["max_rank"]) == 2 and all(1 <= r <= 16 for r in h["max_rank"]) for h in tracked)


def test_run_inheritune_stages(corpus, tmp_path):
    cfg = InherituneConfig(ref_layers=4, student_layers=2, grow_by=1, max_layers=3, d_model=32, n_heads=2, n_ctx=32,
                           d_vocab=VOCAB, train_config=tiny_train_config(steps=4, eval_every=2), rank_inputs=2, rank_len=16,
                           seed=0, ablations=("later_layers", "attention_only", "mlp_only", "stacking"),
                           grow_from="reference")
    result = run_inheritune(cfg, corpus, out_dir=tmp_path, progress=False)
    df = result.to_dataframe()
    kinds = list(df["kind"])
    n = result.final_layers
    assert kinds[0] == "reference" and kinds[-7:] == ["scratch", "scratch"] + ["ablation"] * 3 + ["stack_source", "ablation"]
    assert list(df["stage"])[-5:] == [f"later_layers_{n}L", f"attention_only_{n}L", f"mlp_only_{n}L",
                                      f"stack_source_{n // 2}L", f"stacking_{n}L"]
    assert result.meta["growth"]["grow_from"] == "reference"
    assert "averaged over N=2 inputs" in result.meta["rank"]["definition"]
    students = df[df["kind"] == "student"]
    # grow rule: every student but the last is worse than the reference, unless it reached max_layers
    for _, row in students.iloc[:-1].iterrows():
        assert row["val_loss"] > result.reference_val_loss
    assert result.final_layers == students["n_layers"].iloc[-1]
    last = students.iloc[-1]
    assert last["val_loss"] <= result.reference_val_loss or last["n_layers"] == 3
    assert n >= 2  # so that stacking (from n // 2 layers) ran
    scratch = df[df["kind"] == "scratch"]
    assert list(scratch["n_layers"]) == [result.final_layers] * 2
    assert list(scratch["tokens_seen"]) == [4 * 4 * 16, 8 * 4 * 16]
    for stage in result.stages:  # the rank of every layer at every stage
        assert len(stage.rank["max_rank"]) == stage.n_layers
        assert len(stage.rank_at_init["max_rank"]) == stage.n_layers
    assert (tmp_path / "result.json").exists()


def test_zero_shot_reports_the_papers_metric_per_task():
    from lens_heads.growth.zero_shot import zero_shot
    from lens_heads.training.corpus import gpt2_tokenizer

    model = gpt2_model(gpt2_config(1, d_model=32, n_heads=2, n_ctx=256), seed=0, tokenizer=gpt2_tokenizer())
    rows = {r["task"]: r for r in zero_shot(model, {"hellaswag": "per_char", "arc_easy": "sum", "no_such_task": "sum"},
                                            n=3, seed=0)}
    assert rows["hellaswag"]["primary"] == "per_char"  # acc_norm, as the paper reports HellaSwag
    assert rows["hellaswag"]["accuracy"] == rows["hellaswag"]["accuracy_per_char"]
    assert rows["arc_easy"]["accuracy"] == rows["arc_easy"]["accuracy_sum"]
    assert rows["hellaswag"]["n"] + rows["hellaswag"]["dropped_longer_than_context"] == 3
    assert rows["no_such_task"]["available"] is False
    from lens_heads.data.tasks import load_task

    for task in ("hellaswag", "arc_easy"):  # each row names the split its items came from
        assert rows[task]["split"] == load_task(task, n=1).split and "leading space" in rows[task]["acc_norm"]


def test_inherit_first_layers_of_a_llama_shaped_model():
    from lens_heads import tiny_model
    from lens_heads.growth.inherit import inherit_first_layers, same_size_random

    reference = perturbed(tiny_model("llama", seed=0, n_layers=4), seed=1)
    reference.cfg.init_weights = False  # as in a loaded pretrained model's config
    student = inherit_first_layers(reference, 2, seed=3)
    fresh = same_size_random(reference, 2, seed=3)
    ref, stu, new = state(reference), state(student), state(fresh)
    assert student.cfg.n_layers == 2 and set(stu) == set(new)
    assert {"blocks.1.attn._W_K", "blocks.1.mlp.W_gate"} & set(stu)  # it is the Llama shape (GQA, gated MLP)
    for name, tensor in stu.items():
        if name.startswith("ln_final."):
            assert torch.equal(tensor, new[name]) and not torch.equal(tensor, ref[name]), name
        else:
            assert torch.equal(tensor, ref[name]), name
    with torch.no_grad():  # the student is the reference cut after block 1 (up to the final norm)
        tokens = torch.randint(0, reference.cfg.d_vocab, (2, 8), generator=torch.Generator().manual_seed(0))
        _, cache = reference.run_with_cache(tokens, names_filter="blocks.1.hook_resid_post")
        _, mine = student.run_with_cache(tokens, names_filter="blocks.1.hook_resid_post")
    # the same blocks and weights on the same shapes: the same sums (torch's default float32 tolerance, relative)
    torch.testing.assert_close(mine["blocks.1.hook_resid_post"], cache["blocks.1.hook_resid_post"])
    for name in ("blocks.0.attn.W_Q", "blocks.1.mlp.W_in"):  # the random baseline is initialised, not empty memory
        assert new[name].std().item() == pytest.approx(reference.cfg.initializer_range, rel=0.2), name
    with pytest.raises(ValueError, match=r"1\.\.4"):
        inherit_first_layers(reference, 5)
