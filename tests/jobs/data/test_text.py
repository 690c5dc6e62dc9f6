"""jobs/data/text.py: PTB through `datasets` (local files; the Hub fails fast offline), the pydoc corpus, ids
and batches, byte-level BPE (trained and cached, or GPT-2's files)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch

from jobs.data.errors import DatasetNotFoundError
from jobs.data.text import (
    EOS,
    PTB_FILES,
    UNK,
    HubUnreachableError,
    build_vocab,
    decode,
    encode,
    eval_windows,
    get_batch,
    load_bpe_text,
    load_ptb,
    load_pydoc,
    load_text,
    write_ptb_files,
)

# PTB's layout: pre-tokenised, lower case, N for numbers, <unk> for rare words, a space before and after.
PTB_SAMPLE = {
    "train": [
        "the company said N shares were sold",
        "the <unk> fell N N",
        "",  # blank lines carry no sentence
        "shares of the company rose",
    ],
    "valid": ["the company rose sharply"],
    "test": ["shares fell"],
}


@pytest.fixture
def ptb_folder(tmp_path: Path) -> Path:
    return write_ptb_files(tmp_path / "ptb", PTB_SAMPLE)


@pytest.fixture
def load_dataset_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    real = datasets.load_dataset

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    return calls


def test_ptb_files_load_through_datasets(ptb_folder: Path, load_dataset_calls: list[Any]) -> None:
    assert (ptb_folder / "ptb.train.txt").read_text().startswith(" the company said N shares")
    corpus = load_text("ptb", vocab_size=6, data_files=ptb_folder)
    ((args, kwargs),) = load_dataset_calls
    assert args == ("text",) and set(kwargs["data_files"]) == {"train", "validation", "test"}
    assert kwargs["data_files"]["validation"].endswith("ptb.valid.txt")
    # Train counts: N 3, the 3, company 2, shares 2, then fell/of/rose/said/sold/were once (ties by spelling).
    assert corpus.vocab == [UNK, EOS, "N", "the", "company", "shares"]
    assert decode(corpus.train.tolist(), corpus.vocab) == (
        "the company <unk> N shares <unk> <unk> <eos> the <unk> <unk> N N <eos> shares <unk> the company <unk> <eos>"
    )
    assert decode(corpus.valid.tolist(), corpus.vocab) == "the company <unk> <unk> <eos>"
    assert corpus.test.tolist() == [5, 0, 1] and corpus.train.dtype == torch.long


def test_ptb_folder_missing_a_file(ptb_folder: Path) -> None:
    (ptb_folder / "ptb.test.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"lacks ptb\.test\.txt; it must hold ptb\.train\.txt"):
        load_ptb(ptb_folder)


def test_ptb_from_the_hub_fails_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # datasets reads the variable at import
    start = time.perf_counter()
    with pytest.raises(HubUnreachableError) as info:
        load_ptb()
    assert time.perf_counter() - start < 5.0
    message = str(info.value)
    assert message.startswith("ptb_text_only: not in the local Hugging Face cache and the Hub is off")
    assert "data_files=<folder with ptb.train.txt, ptb.valid.txt, ptb.test.txt>" in message
    assert isinstance(info.value, ConnectionError)


def test_ptb_from_an_unreachable_hub_fails_before_retrying(
    monkeypatch: pytest.MonkeyPatch, load_dataset_calls: list[Any]
) -> None:
    # Offline mode off and no network: datasets alone would retry for ~23 s (stack-notes §5).
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    start = time.perf_counter()
    with pytest.raises(HubUnreachableError, match=r"Hub \(http://127\.0\.0\.1:9\) cannot be reached; pass data_files"):
        load_ptb()
    assert time.perf_counter() - start < 5.0 and load_dataset_calls == []


def test_pydoc_corpus() -> None:
    splits = load_pydoc()
    words = {split: sum(len(s) for s in sentences) for split, sentences in splits.items()}
    assert sum(words.values()) > 50_000, words
    assert words["train"] > 0.85 * sum(words.values()) and min(words["valid"], words["test"]) > 1_000, words
    assert load_pydoc() == splits  # deterministic
    vocab_words = {w for s in splits["train"] for w in s}
    assert "attribute" in vocab_words and "N" in vocab_words
    assert all(w == "N" or w == w.lower() for w in vocab_words)

    corpus = load_text("pydoc", vocab_size=500)
    assert len(corpus.vocab) == 500 and corpus.vocab[:2] == [UNK, EOS] and corpus.vocab[2] == "the"
    assert corpus.train.numel() > 50_000 and int(corpus.train.max()) < 500
    assert load_text("pydoc", vocab_size=500, vocab=corpus.vocab).vocab is corpus.vocab  # a given vocab is kept
    with pytest.raises(ValueError, match="^data_files: only the ptb corpus reads files, got corpus='pydoc'"):
        load_text("pydoc", vocab_size=500, data_files="/tmp")


def test_vocab_and_encode() -> None:
    vocab = build_vocab([["b", "a", "b", "<unk>"], ["c"]], vocab_size=4)
    assert vocab == [UNK, EOS, "b", "a"]  # <unk> in the text is not counted twice; a before c on a tie
    assert encode([["a", "zz"], ["b"]], vocab).tolist() == [3, 0, 1, 2, 1]
    with pytest.raises(ValueError, match="^vocab_size: must be >= 3"):
        build_vocab([["a"]], vocab_size=2)


def test_batches() -> None:
    data = torch.arange(100)
    x, y = get_batch(data, batch_size=4, block_size=8, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8) and torch.equal(y, x + 1)  # next-token targets
    again = get_batch(data, 4, 8, torch.Generator().manual_seed(0))[0]
    assert torch.equal(x, again)
    windows = eval_windows(data, block_size=8)
    assert windows.shape == (12, 9) and windows[1, 0] == 8 and windows[-1, -1] == 96
    assert eval_windows(data, 8, max_windows=3).shape == (3, 9)
    with pytest.raises(ValueError, match="^block_size: must be < the split's 5 tokens, got 8"):
        get_batch(torch.arange(5), 2, 8, torch.Generator())


def test_write_ptb_files_layout(tmp_path: Path) -> None:
    folder = write_ptb_files(tmp_path, {"train": ["a b"], "valid": ["c"], "test": []})
    assert sorted(p.name for p in folder.iterdir()) == sorted(PTB_FILES.values())
    assert (folder / "ptb.train.txt").read_text() == " a b \n" and (folder / "ptb.test.txt").read_text() == ""


def test_bpe_trained_cached_and_read_back_as_gpt2_files(ptb_folder: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    cache = tmp_path / "cache"
    trained = load_bpe_text("ptb", 300, ptb_folder, cache_dir=cache)
    (cached,) = cache.iterdir()
    assert trained.tokenizer_json is not None and len(trained.vocab) <= 300 and trained.vocab[0] == "<|endoftext|>"
    tok = Tokenizer.from_str(trained.tokenizer_json)
    assert tok.decode(trained.valid.tolist()) == " the company rose sharply"  # <|endoftext|> is skipped
    assert trained.valid[-1] == 0 and tok.id_to_token(int(trained.valid[0])) == "Ġthe"  # a word, its space first
    assert Tokenizer.from_file(str(cached)).to_str() == trained.tokenizer_json
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    tok.model.save(str(gpt2))  # GPT-2's original layout: vocab.json + merges.txt
    assert sorted(p.name for p in gpt2.iterdir()) == ["merges.txt", "vocab.json"]
    from_files = load_bpe_text("ptb", 300, ptb_folder, bpe_files=gpt2)
    for split in ("train", "valid", "test"):
        assert torch.equal(getattr(from_files, split), getattr(trained, split)), split
    with pytest.raises(ValueError, match=rf"^vocab_size: the BPE tokenizer has {len(trained.vocab)} tokens, more "):
        load_bpe_text("ptb", 258, ptb_folder, bpe_files=gpt2)
    (gpt2 / "merges.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match="lacks merges.txt; it must hold tokenizer.json, or vocab.json"):
        load_bpe_text("ptb", 300, ptb_folder, bpe_files=gpt2)
