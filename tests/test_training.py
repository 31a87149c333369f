"""The one training loop on solved items (the fine-tune's preset) against a plain PyTorch fine-tune written out here:
its own batch draw, learning rates, full-vocabulary log-softmax over every position, AdamW and clipping."""

import numpy as np
import pytest
import torch

from lens_heads.plumbing.errors import InputError
from lens_heads.training.config import TrainConfig
from lens_heads.training.example_data import Example, ExampleData
from lens_heads.training.loop import train


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def solved_items(n: int, seed: int = 5) -> list[Example]:
    """Random contexts of 2-6 tokens and answers of 1-3 (the row ends one short of the answer's last token)."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        context = g.integers(2, 50, g.integers(2, 7)).tolist()
        answer = g.integers(2, 50, g.integers(1, 4)).tolist()
        out.append(Example(tuple(context + answer[:-1]), len(context) - 1, tuple(answer)))
    return out


def plain_nll(model, batch, pad_id: int = 0) -> torch.Tensor:
    """The answers' mean token negative log-likelihood: each row padded on the right, the whole vocabulary's
    log-softmax at every position, the answer tokens read where they are predicted."""
    width = max(len(e.tokens) for e in batch)
    ids = torch.tensor([list(e.tokens) + [pad_id] * (width - len(e.tokens)) for e in batch])
    mask = torch.tensor([[1] * len(e.tokens) + [0] * (width - len(e.tokens)) for e in batch])
    logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    nll = [-logprobs[b, e.first + k, t] for b, e in enumerate(batch) for k, t in enumerate(e.answer)]
    return torch.stack(nll).mean()


def plain_finetune(model, data: list[Example], steps: int, batch_size: int, lr: float, warmup: int,
                   weight_decay: float, seed: int) -> list[float]:
    """AdamW (torch's betas), weight decay on every matrix, linear warm-up then linear decay to 0, clip at 1."""
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": weight_decay},
                             {"params": others, "weight_decay": 0.0}], lr=lr)
    losses = []
    for step in range(steps):
        rate = lr * (step + 1) / warmup if step < warmup else lr * (steps - step) / (steps - warmup)
        for group in opt.param_groups:
            group["lr"] = rate
        picked = np.random.default_rng([seed, step]).choice(len(data), size=batch_size, replace=False)
        loss = plain_nll(model, [data[i] for i in picked])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.floats
def test_the_loops_answer_loss_fine_tune_equals_a_plain_pytorch_fine_tune():
    items = solved_items(12)
    ours, plain = tiny_llama(), tiny_llama()
    cfg = TrainConfig.finetune(steps=6, batch_size=4, lr=1e-2, warmup_steps=2, weight_decay=0.1, eval_every=3,
                               seed=3)
    result = train(ours, ExampleData(items[:9], items[9:], pad_id=0), cfg, progress=False)
    expected = plain_finetune(plain, items[:9], steps=6, batch_size=4, lr=1e-2, warmup=2, weight_decay=0.1, seed=3)
    losses = [h["train_loss"] for h in result.history if "train_loss" in h]
    # The losses start near log(50) = 3.9; the two read the same logits through different slicing (the loop
    # unembeds the answer positions only), a few float32 roundings apart: seen up to 2e-7 of the values (1 thread,
    # default and vectorised kernels), bounded at 1e-5. The weights (magnitudes up to 1, the norms) came out equal;
    # bounded at 1e-5, the rounding of six Adam steps at 1e-2 on gradients a few roundings apart.
    assert losses == pytest.approx(expected, rel=1e-5)
    for (name, a), (_, b) in zip(ours.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=name)
    with torch.no_grad():
        held_out = float(plain_nll(plain.eval(), items[9:]))
    # the held-out loss is per answer token over all three held-out items (one batch of 4 here: a plain mean)
    assert result.val_loss == pytest.approx(held_out, rel=1e-5)
    assert [h["step"] for h in result.history if "val_loss" in h] == [0, 3, 6]
    assert result.tokens_seen == sum(len(items[i].tokens) for s in range(6)
                                     for i in np.random.default_rng([3, s]).choice(9, 4, replace=False))


def test_the_preset_is_the_one_config_and_refuses_what_it_cannot_run():
    cfg = TrainConfig.finetune(steps=4, lr=1e-3)
    assert isinstance(cfg, TrainConfig) and cfg.schedule == "linear" and cfg.min_lr == 0 and cfg.beta2 == 0.999
    assert TrainConfig.finetune(grad_accum=2).grad_accum == 2  # any other field of the one config
    with pytest.raises(InputError, match="schedule"):
        TrainConfig(schedule="step")
    with pytest.raises(InputError, match="eval_every"):
        TrainConfig.finetune(eval_every=0)
    with pytest.raises(InputError, match="held-out"):
        ExampleData(solved_items(2), [], pad_id=0)


def test_every_config_field_is_an_option_of_every_training_script():
    """The scripts' training flags are built from TrainConfig's fields: a field is a flag of each, spelled the same,
    its value reaching the config the script trains with; the flags' older spellings still parse."""
    from dataclasses import fields

    from conftest import load_script
    from lens_heads.plumbing.settings import from_args

    inheritune, baselines, heal, distributions = (load_script(n) for n in ("inheritune", "inheritune_baselines", "heal",
                                                                            "model_distributions"))
    configs = {
        "inheritune": lambda argv: inheritune.train_config(inheritune.parse_args(argv)),
        "inheritune_baselines": lambda argv: baselines.build_config(baselines.parse_args(["--seeds", "0,1", *argv]),
                                                                    0).train_config,
        "heal": lambda argv: from_args(heal.HealSettings, argv).seed_config(0),
        "model_distributions": lambda argv: distributions.parse_args(argv).train_config(),
    }
    set_by_script = {"inheritune": {"seed", "checkpoint_every"}, "inheritune_baselines": {"seed", "checkpoint_every"},
                     "heal": {"seed", "log_every", "checkpoint_every"}, "model_distributions": {"seed"}}
    for name, config in configs.items():
        for f in fields(TrainConfig):
            if f.name in set_by_script[name]:
                continue
            # min_lr below every script's lr: a min_lr above lr is refused
            value = {"schedule": "linear", "amp": True, "decay_embeddings": True, "min_lr": 7e-7}.get(f.name)
            flag = [f"--{f.name.replace('_', '-')}"] if isinstance(value, bool) else \
                [f"--{f.name.replace('_', '-')}", str(value if value is not None else 7)]
            expected = value if value is not None else 7
            assert getattr(config(flag + (["--rank-len", "7"] if f.name == "seq_len" and name.startswith("inheritune") else [])),
                           f.name) == expected, (name, f.name)
        if name in ("inheritune", "inheritune_baselines"):
            old = config(["--batch", "3", "--seq", "64", "--rank-len", "50", "--warmup", "5"])
            assert (old.batch_size, old.seq_len, old.warmup_steps) == (3, 64, 5)


def test_the_training_namespaces_document_every_name_they_export():
    """lh.training and lh.inheritune export only documented functions and classes (a dataclass's generated signature is
    not a docstring)."""
    import inspect

    import lens_heads as lh

    undocumented = []
    for space in (lh.training, lh.inheritune):
        for name in space.__all__:
            obj = getattr(space, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue  # constants and type aliases
            doc = (obj.__doc__ or "").strip()
            if not doc or doc.startswith(f"{obj.__name__}("):
                undocumented.append(f"{space.__name__}.{name}")
    assert not undocumented


def test_weights_a_model_shares_between_names_are_saved_once_and_restored(tmp_path):
    """Rotary tables shared by the layers of one kind (`share_rotary_tables`) are one tensor under many names:
    written once (safetensors refuses aliases), filled back through the alias on load; every weight round-trips
    exactly, and a file missing a tensor that is not an alias is refused."""
    from safetensors.torch import load as st_load

    from lens_heads.models import tl_internals
    from lens_heads.models.loading import tiny_model
    from lens_heads.training.checkpoints import load_model_state, model_state_bytes

    model = tiny_model("llama", seed=0, n_layers=3)
    assert tl_internals.share_rotary_tables(model) == 1
    names = [n for n in model.state_dict() if n.endswith("rotary_sin")]
    assert len(names) == 3 and len({model.state_dict()[n].data_ptr() for n in names}) == 1
    path = tmp_path / "model.safetensors"
    path.write_bytes(model_state_bytes(model))
    saved = st_load(path.read_bytes())
    assert [n for n in saved if n.endswith("rotary_sin")] == names[:1]
    other = tiny_model("llama", seed=1, n_layers=3)
    tl_internals.share_rotary_tables(other)
    load_model_state(other, path)
    for name, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], value), name
    unshared = tiny_model("llama", seed=1, n_layers=3)  # its tables are separate tensors: the file lacks two
    with pytest.raises(RuntimeError, match="rotary_sin"):
        load_model_state(unshared, path)
