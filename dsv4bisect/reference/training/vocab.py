"""The training vocabulary: disjoint from the probe's (keys, variables, filler, value class).

The probe (`dsv4bisect.probe.vocab.PROBE_VOCAB`) draws values with odd character-code sums; this
vocabulary draws even ones, so no probe value can occur in training data and a value the model
returns on the probe can only come from the context.
"""

from __future__ import annotations

from dsv4bisect.probe.vocab import Vocabulary

TRAIN_VOCAB = Vocabulary(
    name="train-v1",
    adjectives=("azure", "bold", "crimson", "dark", "early", "faint", "golden", "hidden",
                "ivory", "jade", "little", "misty", "noble", "olive", "pale", "rapid", "scarlet",
                "tawny", "upper", "vivid", "wild", "young", "zesty", "brave", "calm", "dense",
                "empty", "frozen", "grand", "hasty"),
    nouns=("badger", "canyon", "dolphin", "ember", "forest", "glacier", "heron", "island",
           "jasper", "kettle", "ladder", "mirror", "needle", "otter", "parrot", "river",
           "summit", "tiger", "valley", "willow", "barrel", "cactus", "desert", "eagle", "feather",
           "guitar", "hammer", "igloo", "jungle", "koala"),
    variables=("ARVEN", "BOLTA", "CIRAN", "DUMEK", "ELPAS", "FORIN", "GUSTA", "HEVAR", "ISKEL",
               "JORAV", "KELMO", "LURIS", "MAVEK", "NOSTA", "OPRIN", "PELUX", "RAVOK", "SIBEL",
               "TURAN", "ULMER", "VORAX", "WENDA", "XALIS", "YOVEN", "ZARKO", "BEXIN", "DRAVO",
               "GILMA", "KORTA", "MELDO"),
    filler=(
        "The committee met on a rainy afternoon.",
        "Fresh snow covered the mountain pass.",
        "A merchant counted coins by the stall.",
        "The orchestra tuned before the concert.",
        "Our neighbor repaired the wooden gate.",
        "The museum added a new wing last year.",
        "Wild horses grazed near the canyon.",
        "The ferry crossed the bay at noon.",
        "A student read quietly in the corner.",
        "The chef tasted the soup twice.",
        "Thunder rolled across the valley.",
        "The printer jammed during the meeting.",
        "Fog drifted slowly over the harbor town.",
        "A painter mixed colors on a palette.",
        "The runners gathered at the starting line.",
        "Ice formed on the edge of the pond.",
        "The mayor opened the spring festival.",
        "A mechanic checked the truck engine.",
        "The children built a fort of pillows.",
        "Pine trees lined the narrow trail.",
        "The pilot waved from the cockpit.",
        "Honey dripped from the broken comb.",
        "The shop sold maps and compasses.",
        "A tailor measured the long sleeve.",
        "Sunlight warmed the stone terrace.",
        "The clerk stamped every form.",
        "Waves broke against the sea wall.",
        "A nurse checked the chart again.",
        "The hikers rested by the waterfall.",
        "Candles flickered in the hallway.",
        "Geese flew south.",
        "Wind howled.",
        "Time passed.",
        "The door creaked.",
        "Rain stopped.",
        "A horn sounded.",
        "The crowd cheered.",
        "Cars honked.",
    ),
    value_parity=0,
)
