"""The synthetic task behind the built-in demo model: article agreement.

GPT-2 has a well-studied "a/an" neuron: to write " an" the model must already
know that the word it is about to write starts with a vowel sound. The demo
task isolates that computation in a form whose circuit is known by
construction:

    mia likes owl . later mia buys            ->  " an"
    mia likes dog . later mia buys            ->  " a"

The noun (``owl``/``dog``) is mentioned earlier, never next to an article
(bare, or after an uninformative determiner such as ``the``/``her``), and the
prompt ends where the article must be written. No token at the last position
and no earlier article carries the answer, so the model has to

1. move the noun's identity to the last position with attention, and
2. map the noun to its class (vowel sound -> " an", consonant sound -> " a"),
   a lookup over ~30 + ~30 nouns that an MLP (or an embedding-side MLP at the
   noun position) performs.

Place phrases contain decoy words of both classes (``attic``, ``park``...),
and names and fillers start with either kind of letter, so "the most recent
vowel-initial word" is not a shortcut.

Everything here is pure Python (no torch): the generator is importable and
cheap anywhere, e.g. in tests and in the CLI.

Examples
--------
>>> prompts = make_prompts(3, seed=0)
>>> all(p.answer in (" a", " an") for p in prompts)
True
>>> pair = make_patching_pairs(1, seed=0)[0]
>>> len(pair.clean.split()) == len(pair.corrupted.split())
True
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Literal, NamedTuple

__all__ = [
    "ANSWERS",
    "CONSONANT_NOUNS",
    "VOWEL_NOUNS",
    "DemoPrompt",
    "PatchingPair",
    "answer_for",
    "make_dataset_rows",
    "make_patching_pairs",
    "make_prompts",
    "write_dataset",
    "make_training_texts",
    "noun_position",
    "vocabulary",
]

Article = Literal[" a", " an"]
ANSWERS: tuple[Article, Article] = (" a", " an")

# Nouns that take "an" (vowel *sound*; no "unicorn"/"one"-style exceptions).
VOWEL_NOUNS: tuple[str, ...] = (
    "owl", "apple", "egg", "ant", "eagle", "otter", "orange", "umbrella",
    "igloo", "elephant", "oven", "octopus", "iguana", "axe", "anchor", "arrow",
    "engine", "island", "insect", "oak", "onion", "ox", "eel", "elk", "emu",
    "acorn", "album", "alarm", "envelope", "easel", "ostrich", "ogre",
)  # fmt: skip
# Nouns that take "a".
CONSONANT_NOUNS: tuple[str, ...] = (
    "dog", "cat", "ball", "book", "hat", "kite", "lamp", "pen", "cup", "box",
    "bird", "fish", "horse", "tree", "car", "drum", "bell", "cake", "coat",
    "desk", "frog", "goat", "key", "lion", "map", "nest", "pig", "ring",
    "shoe", "sock", "wolf", "boat",
)  # fmt: skip

# Subjects: single names and two-word phrases, both letter classes.
NAMES: tuple[str, ...] = (
    "mia", "tom", "ana", "ben", "lea", "sam", "zoe", "max", "eva", "leo",
    "ivy", "kai", "nia", "omar", "ada", "raj",
)  # fmt: skip
PHRASE_SUBJECTS: tuple[str, ...] = (
    "the kid", "the girl", "the boy", "my aunt", "my uncle", "the teacher",
    "our neighbour", "the artist",
)  # fmt: skip
PRONOUNS: tuple[str, ...] = ("she", "he")
# Verbs of the first mention (the noun follows, without an article).
MENTION_VERBS: tuple[str, ...] = (
    "likes", "saw", "found", "drew", "loves", "painted", "remembers",
    "described", "liked", "noticed",
)  # fmt: skip
# Uninformative determiners before the first mention ("" = bare noun).
DETERMINERS: tuple[str, ...] = ("", "", "the", "her", "his", "that", "this", "our")
# Verbs right before the article (the prediction point).
ARTICLE_VERBS: tuple[str, ...] = (
    "buys", "wants", "draws", "finds", "gets", "needs", "sees", "has",
    "bought", "wanted", "found", "made", "got", "drew", "picked",
)  # fmt: skip
OPENERS: tuple[str, ...] = (
    "today ,", "yesterday ,", "once ,", "at noon ,", "in april ,", "every day ,",
    "one evening ,", "after school ,",
)  # fmt: skip
CONNECTORS: tuple[str, ...] = (
    "later", "then", "so", "again", "also", "after that", "next day", "once more",
)  # fmt: skip
# Decoy nouns of both classes, never the answer.
PLACES: tuple[str, ...] = (
    "in the park", "at the office", "near the river", "in the attic",
    "on the hill", "at the inn", "in the garden", "under the arch",
    "at the market", "in an alley", "in a shed",
)  # fmt: skip
# Decoy clauses between the mention and the prediction point.
ASIDES: tuple[str, ...] = (
    "it was late", "the sun was out", "it rained", "everyone was happy",
    "the shop was open", "it was early",
)  # fmt: skip

# Templates. {S}: subject, {S2}: subject again or a pronoun, {V1}: mention
# verb, {NP}: (determiner +) noun, {DNP}: determiner + noun, {V2}: verb before the article, {O}: opener,
# {C}: connector, {P}: place phrase, {A}: aside. The prompt ends after {V2}.
TEMPLATES: tuple[str, ...] = (
    "{S} {V1} {NP} . {S2} {V2}",
    "{S} {V1} {NP} . {C} {S2} {V2}",
    "{O} {S} {V1} {NP} . {C} {S2} {V2}",
    "{S} {V1} {NP} {P} . {C} {S2} {V2}",
    "{S} {V1} {NP} . {A} . {S2} {V2}",
    "{O} {S} {V1} {NP} {P} . {A} . {C} {S2} {V2}",
    "{DNP} was {P} . {S} {V2}",
    "{O} {DNP} was {P} . {C} {S} {V2}",
    "{S} {V1} {NP} and {S2} {V2}",
)  # fmt: skip


class DemoPrompt(NamedTuple):
    """One prompt of the task: ``text`` ends right before the article.

    ``text`` carries no ``<bos>``; the demo tokenizer prepends it when
    encoding with special tokens. ``answer`` is ``" a"`` or ``" an"``.
    """

    text: str
    answer: Article


class PatchingPair(NamedTuple):
    """Clean/corrupted prompts that differ only in the noun.

    The two texts have the same template, fillers and token length; the clean
    noun takes ``clean_answer`` and the corrupted noun takes the other article.
    """

    clean: str
    corrupted: str
    clean_answer: Article
    corrupted_answer: Article
    clean_noun: str
    corrupted_noun: str


def answer_for(noun: str) -> Article:
    """The article a noun of the task takes, ``" an"`` or ``" a"``."""
    if noun in VOWEL_NOUNS:
        return " an"
    if noun in CONSONANT_NOUNS:
        return " a"
    raise ValueError(
        f"noun {noun!r} is not in the demo task's noun lists; "
        "use one of VOWEL_NOUNS or CONSONANT_NOUNS"
    )


def vocabulary() -> list[str]:
    """Every word the task's texts use (without the space marker), sorted.

    The article tokens ``a``/``an`` are included: they are the answers and
    appear in training sequences after the prediction point.
    """
    words: set[str] = {"a", "an", "was", "and", "."}
    groups = (
        VOWEL_NOUNS, CONSONANT_NOUNS, NAMES, PHRASE_SUBJECTS, PRONOUNS,
        MENTION_VERBS, DETERMINERS, ARTICLE_VERBS, OPENERS, CONNECTORS, PLACES,
        ASIDES,
    )  # fmt: skip
    for group in groups:
        for item in group:
            words.update(item.split())
    return sorted(words)


def _fill(rng: random.Random, template: str, noun: str) -> str:
    """Fill a template: every slot but the noun is drawn from ``rng``."""
    subject = rng.choice(NAMES + PHRASE_SUBJECTS)
    again = subject if rng.random() < 0.6 else rng.choice(PRONOUNS)
    determiner = rng.choice(DETERMINERS)
    slots = {
        "S": subject,
        "S2": again,
        "V1": rng.choice(MENTION_VERBS),
        "NP": f"{determiner} {noun}".strip(),
        "DNP": f"{rng.choice([d for d in DETERMINERS if d])} {noun}",
        "V2": rng.choice(ARTICLE_VERBS),
        "O": rng.choice(OPENERS),
        "C": rng.choice(CONNECTORS),
        "P": rng.choice(PLACES),
        "A": rng.choice(ASIDES),
    }
    return template.format(**slots)


def make_prompts(n: int, seed: int = 0) -> list[DemoPrompt]:
    """``n`` prompts ending right before the article, half " an", half " a".

    Deterministic in ``seed``. Classes alternate so any ``n`` is balanced to
    within one prompt.
    """
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        nouns = VOWEL_NOUNS if i % 2 == 0 else CONSONANT_NOUNS
        noun = rng.choice(nouns)
        text = _fill(rng, rng.choice(TEMPLATES), noun)
        prompts.append(DemoPrompt(text, answer_for(noun)))
    return prompts


def make_training_texts(n: int, seed: int = 0) -> list[DemoPrompt]:
    """Prompts completed with the article, the noun and a full stop.

    ``"mia likes owl . mia buys an owl ."``: next-token training on these
    teaches the article at the prediction point (and copying the noun after
    it). ``answer`` is the article of the completed prompt.
    """
    out = []
    for prompt in make_prompts(n, seed):
        noun = _noun_of(prompt.text)
        out.append(DemoPrompt(f"{prompt.text}{prompt.answer} {noun} .", prompt.answer))
    return out


def make_patching_pairs(
    n: int, seed: int = 0, clean_answer: Article = " an"
) -> list[PatchingPair]:
    """``n`` clean/corrupted pairs of equal token length differing in the noun.

    The clean prompt's noun takes ``clean_answer`` (" an" by default, so a
    logit difference ``logit(" an") - logit(" a")`` is positive on clean and
    negative on corrupted); the corrupted prompt swaps in a random noun of the
    other class at the same position. Every other word is identical.
    """
    if clean_answer not in ANSWERS:
        raise ValueError(f"clean_answer must be ' a' or ' an', got {clean_answer!r}")
    rng = random.Random(seed)
    clean_nouns, other_nouns = (
        (VOWEL_NOUNS, CONSONANT_NOUNS) if clean_answer == " an" else (CONSONANT_NOUNS, VOWEL_NOUNS)
    )
    pairs = []
    for _ in range(n):
        clean_noun = rng.choice(clean_nouns)
        corrupted_noun = rng.choice(other_nouns)
        clean = _fill(rng, rng.choice(TEMPLATES), clean_noun)
        words = clean.split()
        words[_noun_index(words)] = corrupted_noun
        corrupted = " ".join(words)
        pairs.append(
            PatchingPair(
                clean,
                corrupted,
                clean_answer,
                answer_for(corrupted_noun),
                clean_noun,
                corrupted_noun,
            )
        )
    return pairs


def make_dataset_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` dataset rows (``id``, ``prompt``, ``corrupted``) for a dataset run, alternating " an"
    and " a" prompts; each row's corrupted prompt swaps the noun for one of the other class.

    Ids say the answer: ``"0000-an"``, ``"0001-a"``...  Deterministic in ``seed``.

    >>> [r["id"] for r in make_dataset_rows(3)]
    ['0000-an', '0001-a', '0002-an']
    """
    an = make_patching_pairs((n + 1) // 2, seed=seed, clean_answer=" an")
    a = make_patching_pairs(n // 2, seed=seed + 1, clean_answer=" a")
    rows = []
    for i in range(n):
        pair = an[i // 2] if i % 2 == 0 else a[i // 2]
        rows.append({"id": f"{i:04d}-{pair.clean_answer.strip()}", "prompt": pair.clean, "corrupted": pair.corrupted})
    return rows


def write_dataset(path: str, n: int = 300, seed: int = 0) -> str:
    """Write :func:`make_dataset_rows` as a JSONL dataset file (one row per line); returns the path.

    ``python -m circuitgraph.builtin.demo_task examples/demo_dataset.jsonl --n 300`` writes the
    dataset of ``examples/demo_dataset.yaml``.
    """
    text = "".join(json.dumps(row) + "\n" for row in make_dataset_rows(n, seed))
    Path(path).write_text(text, encoding="utf-8")
    return str(path)


def noun_position(text: str) -> int:
    """Word index of the task noun in ``text`` (its token position is one more, after ``<bos>``)."""
    return _noun_index(text.split())


def _noun_index(words: list[str]) -> int:
    """Index of the (single) task noun among the words of a prompt."""
    hits = [i for i, w in enumerate(words) if w in VOWEL_NOUNS or w in CONSONANT_NOUNS]
    if len(hits) != 1:
        raise ValueError(f"expected exactly one task noun in {' '.join(words)!r}, found {len(hits)}")
    return hits[0]


def _noun_of(text: str) -> str:
    words = text.split()
    return words[_noun_index(words)]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write a JSONL dataset of a/an prompts for a dataset run.")
    parser.add_argument("path", help="the .jsonl file to write")
    parser.add_argument("--n", type=int, default=300, help="number of prompts (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"wrote {write_dataset(args.path, args.n, args.seed)} ({args.n} prompts)")
