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

Tokenisers: `load_text` splits into words (the vocabulary above); `load_bpe_text` into byte-level BPE tokens
(Hugging Face `tokenizers`, GPT-2's scheme): each sentence is encoded as " " + its words joined by spaces (so
every word, the first too, is a "Ġword" token as in running GPT-2 text) and followed by `<|endoftext|>`, the
BPE stream's `<eos>`. The BPE vocabulary is GPT-2's own when `bpe_files` names a local folder holding its
files (tokenizer.json, or vocab.json + merges.txt: 50257 tokens), else one trained on the train split only
(`vocab_size` tokens at most: 256 bytes, `<|endoftext|>` and merges) and cached as JSON in `cache_dir`, keyed by
the corpus text, the size and the `tokenizers` version, so the trials of a sweep train it once per node.

`get_batch` samples (x, y) windows of `block_size` tokens; `eval_windows` cuts a split into fixed windows.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args
from urllib.parse import urlparse

import torch

from jobs.data.errors import DataError, DatasetNotFoundError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

Corpus = Literal["ptb", "pydoc"]
CORPORA: tuple[str, ...] = get_args(Corpus)
TokenizerKind = Literal["word", "bpe"]
UNK, EOS = "<unk>", "<eos>"
BPE_EOS = "<|endoftext|>"  # GPT-2's end-of-text token, id 50256 in its vocabulary
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
    """Id -> word; ids 0 and 1 are <unk> and <eos> (BPE: id -> token string, GPT-2's "Ġ" marking a space)."""
    train: torch.Tensor
    """[N] int64 token ids of the train split, sentences joined with <eos>."""
    valid: torch.Tensor
    """[N] int64, the validation split."""
    test: torch.Tensor
    """[N] int64, the test split."""
    tokenizer_json: str | None = None
    """BPE only: the tokenizer as `tokenizers` serialises it (a checkpoint keeps it: a resumed trial reuses it)."""


def load_text(
    corpus: str, vocab_size: int, data_files: str | Path | None = None, vocab: list[str] | None = None
) -> TextCorpus:
    """Load, tokenise and encode a corpus; `vocab` (e.g. from a checkpoint) replaces the one built on train."""
    sentences = load_sentences(corpus, data_files)
    vocab = vocab if vocab is not None else build_vocab(sentences["train"], vocab_size)
    return TextCorpus(vocab, *(encode(sentences[split], vocab) for split in SPLITS))


def load_bpe_text(
    corpus: str,
    vocab_size: int,
    data_files: str | Path | None = None,
    bpe_files: str | Path | None = None,
    cache_dir: str | Path | None = None,
    tokenizer_json: str | None = None,
) -> TextCorpus:
    """Load a corpus and encode it with byte-level BPE: GPT-2's files in `bpe_files`, the serialised tokenizer
    `tokenizer_json` (a checkpoint's), or one trained on the train split (cached in `cache_dir`, if given).
    The tokenizer's ids must fit a model of `vocab_size` tokens (a trained one has at most that many)."""
    from tokenizers import Tokenizer  # imported here: only BPE runs need it

    sentences = load_sentences(corpus, data_files)
    if tokenizer_json is not None:
        tok = Tokenizer.from_str(tokenizer_json)
    elif bpe_files is not None:
        tok = load_bpe_files(bpe_files)
    else:
        tok = cached_bpe(bpe_lines(sentences["train"]), vocab_size, cache_dir)
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(
            f"vocab_size: the BPE tokenizer has {tok.get_vocab_size()} tokens, more than the model's {vocab_size}; "
            f"set vocab_size to {tok.get_vocab_size()} (GPT-2's files: 50257)"
        )
    vocab = [tok.id_to_token(i) or "" for i in range(tok.get_vocab_size())]
    encoded = (bpe_encode(tok, sentences[split]) for split in SPLITS)
    return TextCorpus(vocab, *encoded, tokenizer_json=tok.to_str())


def load_sentences(corpus: str, data_files: str | Path | None = None) -> dict[str, list[list[str]]]:
    """split -> sentences (lists of words) of a corpus."""
    if corpus == "ptb":
        return load_ptb(data_files)
    if corpus == "pydoc":
        if data_files is not None:
            raise ValueError(f"data_files: only the ptb corpus reads files, got corpus={corpus!r}")
        return load_pydoc()
    raise ValueError(f"unknown corpus {corpus!r}; known: {', '.join(CORPORA)}")


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


# --- byte-level BPE (Hugging Face tokenizers)


def bpe_lines(sentences: list[list[str]]) -> list[str]:
    """The text BPE sees: one line per sentence, " " + its words, so every word is a "Ġword" token."""
    return [" " + " ".join(words) for words in sentences]


def train_bpe(lines: list[str], vocab_size: int) -> Tokenizer:
    """GPT-2's byte-level BPE trained on `lines`: all 256 bytes, <|endoftext|>, then merges up to vocab_size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 258:
        raise ValueError(
            f"vocab_size: byte-level BPE needs >= 258 (256 bytes, <|endoftext|>, a merge), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # the lines carry their own space
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BPE_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: no text is out of vocabulary
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def cached_bpe(lines: list[str], vocab_size: int, cache_dir: str | Path | None) -> Tokenizer:
    """train_bpe, through a JSON file in cache_dir named by a hash of the text, the size and the library version."""
    import tokenizers
    from tokenizers import Tokenizer

    if cache_dir is None:
        return train_bpe(lines, vocab_size)
    digest = hashlib.sha256(f"{tokenizers.__version__}\n{vocab_size}\n".encode())
    for line in lines:
        digest.update(line.encode() + b"\n")
    path = Path(cache_dir).expanduser() / f"bpe-{vocab_size}-{digest.hexdigest()[:16]}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = train_bpe(lines, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # trials on one node may train at once: the last rename wins
    tok.save(str(tmp))
    os.replace(tmp, path)
    return tok


def load_bpe_files(folder: str | Path) -> Tokenizer:
    """GPT-2's tokenizer from a local folder: tokenizer.json (as the Hub's gpt2 repo has it), or vocab.json and
    merges.txt (its original files), read as byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = Path(folder).expanduser()
    if (folder / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    missing = [name for name in ("vocab.json", "merges.txt") if not (folder / name).is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"bpe_files: {folder} lacks {', '.join(missing)}; it must hold tokenizer.json, or vocab.json and "
            "merges.txt (GPT-2's files); unset bpe_files to train a BPE vocabulary on the train split"
        )
    tok = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def bpe_encode(tok: Tokenizer, sentences: list[list[str]]) -> torch.Tensor:
    """Sentences -> [N] int64 BPE ids, each sentence followed by <|endoftext|>."""
    eos = tok.token_to_id(BPE_EOS)
    if eos is None:
        raise DataError(f"the BPE vocabulary has no {BPE_EOS} token (GPT-2's has it, id 50256)")
    ids = [i for enc in tok.encode_batch(bpe_lines(sentences)) for i in (*enc.ids, eos)]
    return torch.tensor(ids, dtype=torch.long)


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
