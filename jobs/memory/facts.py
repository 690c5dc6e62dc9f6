"""Synthetic subject -> attribute facts written into training sentences, for the knowledge-neuron task (memory.neurons).

A world has `num_subjects` made-up names (two consonant-vowel syllables, "bako", "mitu") and three relations, each
with eight possible attributes; every subject gets one attribute per relation, drawn uniformly. Each fact is written
as one sentence per template of its relation, the attribute last:

    "the capital of bako is arvel <eos>", "bako has its capital in arvel <eos>", "bako 's capital city is arvel <eos>"

The templates of a relation play the role of PARAREL's paraphrased prompts (Dai et al., ACL 2022, §3): a prompt is a
sentence without its attribute. Every template has `PROMPT_LEN` words, so all prompts stack into one [P, T] tensor
and the attribute is always predicted at the last position. Generated here from a seed: nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jobs.data.text import EOS, UNK

PROMPT_LEN = 5
"""Words per prompt (template with its subject filled in); the attribute is the word after them."""

RELATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "capital": (
        ("the capital of {s} is", "{s} has its capital in", "{s} 's capital city is"),
        ("arvel", "bostra", "cendor", "dalum", "erisk", "farno", "gostel", "hivra"),
    ),
    "color": (
        ("the flag of {s} is", "{s} has a flag colored", "{s} 's flag color is"),
        ("red", "blue", "green", "yellow", "white", "black", "purple", "orange"),
    ),
    "sport": (
        ("the sport of {s} is", "{s} is famous for playing", "{s} 's national sport is"),
        ("chess", "tennis", "rugby", "hockey", "polo", "rowing", "judo", "golf"),
    ),
}
"""relation -> (templates with {s} for the subject, its attributes). Names and attributes are disjoint."""

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class FactWorld:
    vocab: list[str]
    """Token strings: <unk>, <eos>, template words, attributes, subjects (id = index)."""
    facts: list[tuple[int, str, int]]
    """(subject id, relation, attribute id), subject-major: fact f is subject f // 3, relation f % 3."""

    def prompts(self, fact: int) -> torch.Tensor:
        """The fact's prompts, one per template of its relation: [P, PROMPT_LEN] token ids."""
        subject, relation, _ = self.facts[fact]
        ids = {w: i for i, w in enumerate(self.vocab)}
        rows = [[ids[w] for w in t.format(s=self.vocab[subject]).split()] for t in RELATIONS[relation][0]]
        return torch.tensor(rows)

    def alternative(self, fact: int) -> int:
        """Another attribute of the same relation (the next in its list): the new value a fact edit writes."""
        _, relation, attribute = self.facts[fact]
        names = RELATIONS[relation][1]
        return self.vocab.index(names[(names.index(self.vocab[attribute]) + 1) % len(names)])

    def sentences(self) -> torch.Tensor:
        """Every fact in every template with its attribute and <eos>: [F x P, PROMPT_LEN + 2] token ids."""
        eos = self.vocab.index(EOS)
        rows = []
        for f, (_, _, attribute) in enumerate(self.facts):
            prompts = self.prompts(f)
            tail = torch.tensor([attribute, eos]).expand(len(prompts), 2)
            rows.append(torch.cat([prompts, tail], dim=1))
        return torch.cat(rows)


def make_world(num_subjects: int, seed: int) -> FactWorld:
    """A seeded world of `num_subjects` distinct made-up names, three facts each (module docstring)."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70: up to 4,900 two-syllable names
    if not 1 <= num_subjects <= 4800:
        raise ValueError(f"num_subjects: must be in [1, 4800], got {num_subjects}")
    words = sorted({w for templates, _ in RELATIONS.values() for t in templates for w in t.split() if w != "{s}"})
    attributes = [a for _, values in RELATIONS.values() for a in values]
    g = torch.Generator().manual_seed(seed)
    names = [syllables[p // len(syllables)] + syllables[p % len(syllables)] for p in torch.randperm(4900, generator=g)]
    names = [n for n in names if n not in attributes][:num_subjects]  # "polo" is a sport, not a name
    vocab = [UNK, EOS, *words, *attributes, *names]
    assert len(set(vocab)) == len(vocab), "template words and attributes overlap"  # RELATIONS is ours, not input
    first_name = len(vocab) - num_subjects
    facts = []
    for s in range(num_subjects):
        for relation, (_, values) in RELATIONS.items():
            value = values[int(torch.randint(len(values), (1,), generator=g))]
            facts.append((first_name + s, relation, vocab.index(value)))
    return FactWorld(vocab, facts)
