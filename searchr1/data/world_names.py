"""Fictional names for the generated world, and near-duplicate variants of them.

Every name is built from syllables, so no real-world knowledge can answer a question about
it: a model has to search. ``NameMaker`` hands out each name (and each of its words) at most
once, which keeps entities distinguishable after SQuAD-style normalisation, and derives the
near-duplicate names of distractor entities ("Drennick Labs" → "Drennick Laboratories",
"Brennick Labs") that make retrieval and reading harder.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kr", "l", "m", "n", "p", "r", "s",
           "st", "t", "th", "v", "z", "h", "j", "c", "cl", "sh", "w")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ae", "ei", "ou", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "nd", "rn", "ck", "ll", "m", "x", "sk", "v")
_CITY_ENDINGS = ("", "", "", "holm", "vik", "ora", "mere", "ford", "stad", "ino")
_ORG_SUFFIXES = ("Labs", "Works", "Press", "Instruments", "Foundry", "Company", "Guild",
                 "Society", "Group", "Trading House", "Studios", "Institute")
# A near-duplicate organisation may keep its stem and swap the suffix for a look-alike.
_SUFFIX_TWINS = {"Labs": "Laboratories", "Works": "Workshops", "Press": "Publishing",
                 "Instruments": "Instrument Company", "Foundry": "Foundries",
                 "Company": "Corporation", "Guild": "Guildhall", "Society": "Association",
                 "Group": "Holdings", "Trading House": "Traders", "Studios": "Studio",
                 "Institute": "Institution"}
_ADJECTIVES = ("Silent", "Glass", "Crimson", "Hollow", "Last", "Northern", "Broken", "Golden",
               "Quiet", "Distant", "Iron", "Pale", "Amber", "Sunken", "Winter", "Salt")
_NOUNS = ("Harbor", "Garden", "Lantern", "Orchard", "Tide", "Bell", "Mirror", "Road", "Tower",
          "Shore", "Ember", "Meadow", "Bridge", "Crown", "Archive", "Compass")
# Consonants that look or sound alike, used to mutate the first letter of a word.
_LOOKALIKE = {"b": "d", "d": "b", "t": "d", "k": "g", "g": "k", "m": "n", "n": "m", "v": "f",
              "f": "v", "s": "z", "z": "s", "r": "l", "l": "r", "p": "b", "h": "k", "j": "g",
              "c": "k", "w": "v"}
# Title and suffix words that many names share; they are never reserved.
_COMMON_WORDS = frozenset(
    {w.lower() for w in _ADJECTIVES + _NOUNS} | {w.lower() + "s" for w in _NOUNS} | {"of", "co"}
    | {w.lower() for s in _ORG_SUFFIXES + tuple(_SUFFIX_TWINS.values()) for w in s.split()})
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """SQuAD-style normalisation: lowercase, drop punctuation and articles, squeeze spaces.

    The reward uses the same rules, so two names that normalise alike would be the same
    answer; the world checks containment with this function too.
    """
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCT))
    return " ".join(text.split())


def contains_phrase(haystack: str, needle: str) -> bool:
    """Whether ``needle`` occurs in ``haystack`` as whole words, after normalisation."""
    needle_n = normalize_text(needle)
    return bool(needle_n) and f" {needle_n} " in f" {normalize_text(haystack)} "


class NameMaker:
    """Draws fresh fictional names from one seeded RNG, never handing out a name twice.

    Full names and their individual words are both reserved, so a city never shares a word
    with a surname and an answer never hides inside another entity's name.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._used: set[str] = set()
        self._shared: set[str] = set()

    def first_names(self, count: int) -> list[str]:
        """A pool of fresh first names, which (unlike every other word) may repeat."""
        names = [self.single() for _ in range(count)]
        self._shared.update(name.lower() for name in names)
        return names

    def reserve(self, name: str, allowed: frozenset[str] = frozenset()) -> bool:
        """Claim ``name`` and its distinctive words; False (claiming nothing) if any is taken.

        ``allowed`` lists words that may be reused: a distractor keeps a word of the name
        it imitates.
        """
        keys = [key for key in self._keys(name) if key not in allowed]
        if any(key in self._used for key in keys):
            return False
        self._used.update(keys)
        return True

    def fresh(self, make: Callable[[], str], allowed: frozenset[str] = frozenset()) -> str:
        """Call ``make`` until it yields a name nobody holds yet, and reserve it."""
        for _ in range(500):
            name = make()
            if self.reserve(name, allowed):
                return name
        raise RuntimeError("name space exhausted; lower the world sizes")

    def word(self, syllables: int) -> str:
        """One capitalised pseudo-word of the given number of syllables."""
        parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
        return ("".join(parts) + self.rng.choice(_CODAS)).capitalize()

    def single(self, endings: tuple[str, ...] = ("",)) -> str:
        """A fresh one-word name of at least four letters (a region, a river, a first name)."""
        def make() -> str:
            name = self.word(self.rng.choice((1, 2))) + self.rng.choice(endings)
            return name if len(name) >= 4 else name + self.rng.choice(("an", "el", "or", "ath"))

        return self.fresh(make)

    def city(self) -> str:
        """A fresh city name, sometimes with a place-like ending ("Tormholm")."""
        return self.single(_CITY_ENDINGS)

    def person(self, first_names: list[str]) -> str:
        """A fresh "First Last" name; first names repeat across people, surnames do not."""
        def make() -> str:
            surname = self.word(3 if self.rng.random() < 0.25 else 2)
            return f"{self.rng.choice(first_names)} {surname}"

        return self.fresh(make)

    def org(self) -> str:
        """A fresh organisation name: a syllable stem plus a suffix ("Drennick Labs")."""
        return self.fresh(lambda: f"{self.word(2)} {self.rng.choice(_ORG_SUFFIXES)}")

    def work(self) -> str:
        """A fresh title: "The Glass Harbor", "Harbor of Vellan" or "Vellan Lantern"."""
        def make() -> str:
            noun, pattern = self.rng.choice(_NOUNS), self.rng.randrange(3)
            if pattern == 0:
                return f"The {self.rng.choice(_ADJECTIVES)} {noun}"
            return f"{noun} of {self.word(2)}" if pattern == 1 else f"{self.word(2)} {noun}"

        return self.fresh(make)

    def variant(self, name: str, kind: str, first_names: list[str]) -> str:
        """A near-duplicate of ``name`` for a distractor entity of the given kind."""
        def make() -> str:
            words = name.split()
            if kind == "org" and self.rng.random() < 0.5:
                suffix = " ".join(words[1:])
                return f"{words[0]} {_SUFFIX_TWINS.get(suffix, suffix + 's')}"
            if kind == "person" and self.rng.random() < 0.3:
                return f"{self.rng.choice(first_names)} {words[-1]}"
            if kind == "work" and words[-1] in _NOUNS and self.rng.random() < 0.5:
                return " ".join(words[:-1] + [words[-1] + "s"])
            idx = self._mutable_index(words, kind)
            words[idx] = self._mutate(words[idx])
            return " ".join(words)

        return self.fresh(make, allowed=frozenset(self._keys(name)[1:]))

    def _mutable_index(self, words: list[str], kind: str) -> int:
        """Which word of a multi-word name a one-letter mutation should touch."""
        if kind == "person":
            return len(words) - 1
        if kind == "org":
            return 0
        candidates = [i for i, w in enumerate(words)
                      if w not in _NOUNS and w not in _ADJECTIVES and w not in ("The", "of")]
        return self.rng.choice(candidates) if candidates else len(words) - 1

    def _mutate(self, word: str) -> str:
        """Change one letter: a look-alike first consonant, another vowel, or one more letter."""
        choice = self.rng.randrange(3)
        head = word[0].lower()
        if choice == 0 and head in _LOOKALIKE:
            return (_LOOKALIKE[head] + word[1:]).capitalize()
        vowels = [i for i, ch in enumerate(word) if ch in "aeiouy" and i > 0]
        if choice == 1 and vowels:
            i = self.rng.choice(vowels)
            return word[:i] + self.rng.choice([v for v in "aeiou" if v != word[i]]) + word[i + 1:]
        return word + self.rng.choice("aek")

    def _keys(self, name: str) -> list[str]:
        """The strings a name claims: its normalised whole and its distinctive words."""
        whole = normalize_text(name)
        words = [w for w in whole.split() if w not in _COMMON_WORDS and w not in self._shared]
        return [f"={whole}"] + words
