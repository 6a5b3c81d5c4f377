"""Vocabularies the conversation formats draw from.

The formats (`probe/formats.py`) are functions of a `Vocabulary`, so a training-data generator can
reuse the exact formats with its own vocabulary. The probe's vocabulary and a training vocabulary
must be disjoint (`overlap()` says where they are not): keys, variable names and filler sentences
share nothing, and values fall in complementary classes (`value_parity`), so a value the model
returns on the probe can only have come from the context, never from memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Vocabulary:
    """Words a format may use. All text is ASCII (one token per character on byte tokenizers)."""

    name: str
    adjectives: tuple[str, ...]  # keys are "<adjective> <noun>"
    nouns: tuple[str, ...]
    variables: tuple[str, ...]  # variable names for `vartrack` (upper case)
    filler: tuple[str, ...]  # neutral sentences, each ending in "."
    value_parity: int  # every drawn value has sum(map(ord, value)) % 2 == value_parity
    pad_unit: str = "."  # one token on byte-level tokenizers; the fitter measures it anyway

    def __post_init__(self) -> None:
        if self.value_parity not in (0, 1):
            raise ValueError("value_parity must be 0 or 1")
        if len(self.adjectives) < 4 or len(self.nouns) < 4 or len(self.variables) < 8:
            raise ValueError("a vocabulary needs >= 4 adjectives, >= 4 nouns and >= 8 variables")
        if not self.filler or any(not s.endswith(".") for s in self.filler):
            raise ValueError("filler sentences must exist and end with '.'")
        text = "".join((*self.adjectives, *self.nouns, *self.variables, *self.filler))
        if not text.isascii():
            raise ValueError("vocabulary text must be ASCII")

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(f"{a} {n}" for a in self.adjectives for n in self.nouns)


def overlap(a: Vocabulary, b: Vocabulary) -> list[str]:
    """What two vocabularies share (empty when they are safe to use as probe vs training)."""
    shared: list[str] = []
    for label, x, y in (("key", a.keys, b.keys), ("variable", a.variables, b.variables),
                        ("filler", a.filler, b.filler)):
        shared += [f"{label}: {w}" for w in sorted(set(x) & set(y))]
    if a.value_parity == b.value_parity:
        shared.append(f"value parity: both draw values with parity {a.value_parity}")
    return shared


PROBE_VOCAB = Vocabulary(
    name="probe-v1",
    adjectives=("amber", "brisk", "cobalt", "dusty", "eager", "fuzzy", "gentle", "hollow",
                "icy", "jolly", "keen", "lunar", "mellow", "nimble", "opal", "proud", "quiet",
                "rusty", "silent", "tidy"),
    nouns=("falcon", "harbor", "lantern", "meadow", "orchid", "pebble", "quarry", "ribbon",
           "saddle", "tunnel", "violin", "walrus", "anchor", "beacon", "candle", "dagger",
           "engine", "fossil", "garnet", "helmet"),
    variables=("KOVAL", "BRINE", "TOMAR", "ZELKA", "PIRUN", "DASOV", "MERIT", "HOLAN", "VESKA",
               "GARON", "LUTIX", "FENRA", "SOMAK", "RIVEL", "NADOR", "QUELT", "YARIN", "CAVOS",
               "TELMA", "WOSEK"),
    filler=(
        "The river runs past the old mill.",
        "A cold wind moved over the hills.",
        "The market opens early on Mondays.",
        "Two boats were tied at the pier.",
        "The library closes after sunset.",
        "A gray cat slept on the warm step.",
        "The road to town was long and dry.",
        "Snow fell on the roofs all night.",
        "The baker made bread before dawn.",
        "A small bird sang in the tall tree.",
        "The train left the station on time.",
        "Old maps hung on the office wall.",
        "The garden needs water every day.",
        "A quiet crowd waited for the bus.",
        "The lamp on the desk was still on.",
        "Rain tapped on the kitchen window.",
        "The clock in the hall struck nine.",
        "A farmer sold apples by the gate.",
        "The bridge was painted last spring.",
        "Leaves covered the path in the park.",
        "The ship sailed north along the coast.",
        "A child drew circles in the sand.",
        "The tea in the pot had gone cold.",
        "Fresh paint dried on the fence.",
        "The choir sang in the village hall.",
        "A long queue formed at the bank.",
        "The stars were bright over the lake.",
        "The doctor walked to work today.",
        "Boxes of books filled the attic.",
        "A soft light came through the door.",
        "The fields turned gold in autumn.",
        "The kettle whistled in the kitchen.",
        "Birds sang.",
        "It rained.",
        "All was calm.",
        "The sun rose.",
        "Dogs barked.",
        "A bell rang.",
        "The bus was late.",
        "Night came.",
    ),
    value_parity=1,
)
