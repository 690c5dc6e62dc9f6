"""Word-level language-modelling corpora: Penn Treebank (PTB) and the Python documentation (offline).

`load_text(corpus, vocab_size, ...)` returns a `TextCorpus`: a vocabulary and each split as one stream of
token ids ([N] int64), every sentence followed by `<eos>`, as in Mikolov's PTB setup and PyTorch's
word_language_model. The vocabulary is built on the train split only: `<unk>`, `<eos>`, then the
`vocab_size - 2` most frequent words (ties by spelling, so it is deterministic); other words map to `<unk>`.

- ptb: `datasets.load_dataset("ptb_text_only")` (splits train / validation / test, field "sentence"; the
  text is already tokenised: lower case, numbers as N, rare words as <unk>, 10k word types with <eos>). It
  needs the Hugging Face Hub, or its cache with HF_DATASETS_OFFLINE=1. Without either it fails at once with
  `HubUnreachableError` instead of retrying for ~23 s (stack-notes §5). `data_files=<folder>` reads the three
  files of the usual PTB distribution (ptb.train.txt, ptb.valid.txt, ptb.test.txt) through
  `load_dataset("text", ...)`, the same `datasets` path, with no network.
- pydoc: the English prose of the Python documentation that CPython ships for `help()`:
  `pydoc_data.topics.topics` (79 topics, ~465 KB and ~66k words under Python 3.11; it changes with the
  Python version). Lower-cased, tokenised like PTB (words, numbers as N, punctuation dropped), one sentence
  per paragraph, and split by paragraph index: every 20th paragraph (from the 19th) is valid, the one after
  it test, the rest train (about 90 / 5 / 5).

`get_batch` samples (x, y) windows of `block_size` tokens; `eval_windows` cuts a split into fixed windows.
"""

from __future__ import annotations

import re
import socket
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args
from urllib.parse import urlparse

import torch

from jobs.data.errors import DataError, DatasetNotFoundError

Corpus = Literal["ptb", "pydoc"]
CORPORA: tuple[str, ...] = get_args(Corpus)
UNK, EOS = "<unk>", "<eos>"
SPLITS = ("train", "valid", "test")
PTB_HUB_ID = "ptb_text_only"
PTB_FILES = {"train": "ptb.train.txt", "valid": "ptb.valid.txt", "test": "ptb.test.txt"}
_HUB_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[0-9]+(?:[.,][0-9]+)*")


class HubUnreachableError(DataError, ConnectionError):
    """The Hugging Face Hub cannot be reached; pass data_files=<folder with ptb.train.txt, ptb.valid.txt,
    ptb.test.txt> or set HF_DATASETS_OFFLINE=1 to read a cached copy."""


@dataclass(frozen=True)
class TextCorpus:
    vocab: list[str]
    """Id -> word; ids 0 and 1 are <unk> and <eos>."""
    train: torch.Tensor
    """[N] int64 token ids of the train split, sentences joined with <eos>."""
    valid: torch.Tensor
    """[N] int64, the validation split."""
    test: torch.Tensor
    """[N] int64, the test split."""


def load_text(
    corpus: str, vocab_size: int, data_files: str | Path | None = None, vocab: list[str] | None = None
) -> TextCorpus:
    """Load, tokenise and encode a corpus; `vocab` (e.g. from a checkpoint) replaces the one built on train."""
    if corpus == "ptb":
        sentences = load_ptb(data_files)
    elif corpus == "pydoc":
        if data_files is not None:
            raise ValueError(f"data_files: only the ptb corpus reads files, got corpus={corpus!r}")
        sentences = load_pydoc()
    else:
        raise ValueError(f"unknown corpus {corpus!r}; known: {', '.join(CORPORA)}")
    vocab = vocab if vocab is not None else build_vocab(sentences["train"], vocab_size)
    return TextCorpus(vocab, *(encode(sentences[split], vocab) for split in SPLITS))


# --- corpora: split -> sentences, each a list of words


def load_ptb(data_files: str | Path | None = None) -> dict[str, list[list[str]]]:
    """PTB from the Hub (`ptb_text_only`), or from a folder holding the ptb.{train,valid,test}.txt files."""
    import datasets  # imported here: ~1 s, and only PTB needs it

    if data_files is not None:
        folder = Path(data_files).expanduser()
        missing = [name for name in PTB_FILES.values() if not (folder / name).is_file()]
        if missing:
            raise DatasetNotFoundError(
                f"data_files: {folder} lacks {', '.join(missing)}; it must hold {', '.join(PTB_FILES.values())}"
            )
        # A throwaway cache: the files are read in seconds, and nothing is left in ~/.cache.
        with tempfile.TemporaryDirectory() as cache:
            files = {_HUB_SPLITS[split]: str(folder / name) for split, name in PTB_FILES.items()}
            ds = datasets.load_dataset("text", data_files=files, cache_dir=cache)
            return {split: _split_words(ds[_HUB_SPLITS[split]]["text"]) for split in SPLITS}

    if not datasets.config.HF_HUB_OFFLINE and not _reachable(datasets.config.HF_ENDPOINT):
        raise HubUnreachableError(
            f"{PTB_HUB_ID}: the Hugging Face Hub ({datasets.config.HF_ENDPOINT}) cannot be reached; pass "
            f"data_files=<folder with {', '.join(PTB_FILES.values())}>, or set HF_DATASETS_OFFLINE=1 to read a "
            "cached copy"
        )
    try:
        try:
            ds = datasets.load_dataset(PTB_HUB_ID)
        except RuntimeError as exc:
            if "scripts are no longer supported" not in str(exc):
                raise
            # The Hub repo has carried a loading script, which datasets >= 4 refuses to run; the Hub's own
            # Parquet export of it is read instead. (Not exercised here: there is no network.)
            ds = datasets.load_dataset(PTB_HUB_ID, revision="refs/convert/parquet")
    except ConnectionError as exc:  # offline mode with no cached copy: raised at once
        raise HubUnreachableError(
            f"{PTB_HUB_ID}: not in the local Hugging Face cache and the Hub is off (HF_DATASETS_OFFLINE / "
            f"HF_HUB_OFFLINE is set): {exc}; pass data_files=<folder with {', '.join(PTB_FILES.values())}>"
        ) from exc
    return {split: _split_words(ds[_HUB_SPLITS[split]]["sentence"]) for split in SPLITS}


def load_pydoc() -> dict[str, list[list[str]]]:
    """The Python documentation's topics (`pydoc_data.topics`), lower-cased, one sentence per paragraph."""
    from pydoc_data.topics import topics

    paragraphs: list[list[str]] = []
    for name in sorted(topics):  # a fixed order, whatever the dict's
        for paragraph in re.split(r"\n\s*\n", topics[name].lower()):
            words = ["N" if w[0].isdigit() else w for w in _WORD.findall(paragraph)]  # PTB writes numbers as N
            if words:
                paragraphs.append(words)
    out: dict[str, list[list[str]]] = {split: [] for split in SPLITS}
    for i, words in enumerate(paragraphs):
        out["valid" if i % 20 == 18 else "test" if i % 20 == 19 else "train"].append(words)
    return out


def _split_words(lines: Iterable[str]) -> list[list[str]]:
    return [words for words in (line.split() for line in lines) if words]  # PTB lines are pre-tokenised


def _reachable(url: str, timeout: float = 5.0) -> bool:
    parsed = urlparse(url)
    try:
        socket.create_connection(
            (parsed.hostname or "", parsed.port or (80 if parsed.scheme == "http" else 443)), timeout=timeout
        ).close()
    except OSError:
        return False
    return True


# --- vocabulary and ids


def build_vocab(sentences: list[list[str]], vocab_size: int) -> list[str]:
    """<unk>, <eos>, then the vocab_size - 2 most frequent words (ties by spelling)."""
    if vocab_size < 3:
        raise ValueError(f"vocab_size: must be >= 3 (<unk>, <eos> and a word), got {vocab_size}")
    counts = Counter(w for words in sentences for w in words)
    for special in (UNK, EOS):
        counts.pop(special, None)  # PTB's text already contains <unk>
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [UNK, EOS, *(w for w, _ in ranked[: vocab_size - 2])]


def encode(sentences: list[list[str]], vocab: list[str]) -> torch.Tensor:
    """Sentences -> [N] int64 ids, each sentence followed by <eos>; unknown words -> <unk>."""
    index = {w: i for i, w in enumerate(vocab)}
    unk, eos = index[UNK], index[EOS]
    ids = [i for words in sentences for i in (*(index.get(w, unk) for w in words), eos)]
    return torch.tensor(ids, dtype=torch.long)


def decode(ids: Iterable[int], vocab: list[str]) -> str:
    return " ".join(vocab[i] for i in ids)


# --- batches


def get_batch(
    data: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows, nanoGPT's "poor man's data loader": x [B, T] and y = x shifted by one token."""
    if len(data) <= block_size:
        raise ValueError(f"block_size: must be < the split's {len(data)} tokens, got {block_size}")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # [B] window starts
    x = torch.stack([data[i : i + block_size] for i in ix.tolist()])  # [B, T]
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix.tolist()])  # [B, T]
    return x, y


def eval_windows(data: torch.Tensor, block_size: int, max_windows: int | None = None) -> torch.Tensor:
    """Consecutive non-overlapping windows of block_size + 1 tokens (inputs and next-token targets): [W, T + 1].

    The same windows every evaluation, so val/loss moves only when the model does.
    """
    count = (len(data) - 1) // block_size
    if count == 0:
        raise ValueError(f"block_size: must be < the split's {len(data)} tokens, got {block_size}")
    if max_windows is not None:
        count = min(count, max_windows)
    starts = torch.arange(count) * block_size  # [W]
    return torch.stack([data[s : s + block_size + 1] for s in starts.tolist()])  # [W, T + 1]


def write_ptb_files(folder: str | Path, splits: dict[str, list[str]]) -> Path:
    """Write ptb.{train,valid,test}.txt in PTB's layout (one sentence a line, space-padded); tests use it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in PTB_FILES.items():
        (folder / name).write_text("".join(f" {line} \n" for line in splits[split]), encoding="utf-8")
    return folder
