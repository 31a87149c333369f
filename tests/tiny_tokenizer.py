"""The tiny tokenizer the fast tests give their tiny random models (``tests/data/tiny_tokenizer``), so that text
tests need no embedded model: a byte-level BPE shaped as the embedded SmolLM2-135M-Instruct's is (the same
pre-tokenizer and decoder, its special tokens in its roles, a ChatML template that renders as its template does;
``test_models.py`` checks both against it), with a vocabulary of ``VOCAB_SIZE`` trained on the shipped
benchmarks' text. Every text encodes (bytes are the base alphabet), into more tokens than SmolLM2 would give it.
Write it again with::

    PYTHONPATH=. .venv/bin/python tests/tiny_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "data" / "tiny_tokenizer"
VOCAB_SIZE = 1024
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2, as in SmolLM2
ROLES = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
         "unk_token": "<|endoftext|>"}
# ChatML with SmolLM2-135M-Instruct's default system turn: the rendering tests/data/chat_reference.json was made with
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# one-token answers the tests lean on: MMLU's letters are read in one row, as lm-eval groups one-token choices
MUST_BE_ONE_TOKEN = [" A", " B", " C", " D"]


def training_text() -> list[str]:
    """Contexts and answers of every shipped multiple-choice benchmark (a few hundred items each, fixed seeds)."""
    from lens_heads import load_task

    texts = []
    for name, kwargs in [("arc_easy", {}), ("mmlu", {"shots": 1}), ("piqa", {}), ("winogrande", {}),
                         ("hellaswag", {})]:
        for item in load_task(name, n=300, seed=0, **kwargs):
            texts += [c + x for c, x in zip(item.contexts, item.continuations)]
    return texts


def build():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer=trainer)
    missing = [t for t in MUST_BE_ONE_TOKEN if len(tok.encode(t).ids) != 1]
    if missing:
        raise SystemExit(f"{missing} are not one token each: train on more text or a larger vocabulary")
    return tok


def main() -> None:
    FOLDER.mkdir(parents=True, exist_ok=True)
    build().save(str(FOLDER / "tokenizer.json"), pretty=False)
    config = dict(ROLES, tokenizer_class="PreTrainedTokenizerFast", model_max_length=1_000_000,
                  chat_template=CHAT_TEMPLATE)
    (FOLDER / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    print(f"wrote {FOLDER}")


if __name__ == "__main__":
    main()
