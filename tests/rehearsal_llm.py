"""The rehearsal's stand-in for the LLM behind the local OpenAI-compatible test server: concept chains from captions.

The fake server's default concept reply is a hash ("topic 3fa2c1"), which gives every image its own l1 concept:
MAGIC then merges or removes every node and nothing is left to train on. The rehearsal needs what a real LLM
gives: a few dozen l1 concepts shared by many images, and more general concepts above them. This answers like
a very plain LLM would: the first theme whose keywords occur in the image's captions is its l1 concept, and
fixed tables lift l1 to l2, l3 and l4. It is deterministic, knows COCO's everyday scenes and the synthetic
world's vocabulary only through plain keywords, and never claims to be good: the rehearsal checks the code
path, not the concepts.
"""

from __future__ import annotations

import re

# l1 theme -> keywords (whole words, lower case); the first theme with a match wins, in this order
L1_KEYWORDS: list[tuple[str, tuple[str, ...]]] = [
    ("tennis match", ("tennis", "racket", "racquet")),
    ("baseball game", ("baseball", "bat", "batter", "pitcher", "catcher")),
    ("skiing", ("ski", "skis", "skiing", "skier", "slope", "snowboard", "snowboarder")),
    ("surfing", ("surf", "surfer", "surfing", "surfboard", "wave", "waves")),
    ("skateboarding", ("skateboard", "skateboarder", "skate", "skating")),
    ("frisbee play", ("frisbee", "kite", "kites")),
    ("rail travel", ("train", "trains", "tracks", "railroad", "station")),
    ("air travel", ("airplane", "plane", "jet", "airport", "aircraft")),
    ("boating", ("boat", "boats", "harbor", "dock", "sailboat")),
    ("street traffic", ("bus", "buses", "traffic", "intersection", "truck", "cars", "taxi")),
    ("cycling", ("bike", "bicycle", "motorcycle", "motorbike", "scooter")),
    ("safari", ("giraffe", "giraffes", "zebra", "zebras", "elephant", "elephants")),
    ("ranch life", ("horse", "horses", "cow", "cows", "sheep", "cattle", "farm")),
    ("pet care", ("dog", "dogs", "cat", "cats", "puppy", "kitten")),
    ("bird watching", ("bird", "birds", "pigeon", "pigeons", "duck", "ducks", "seagull")),
    ("pizza meal", ("pizza", "pizzas")),
    ("dessert", ("cake", "cakes", "donut", "donuts", "doughnut", "dessert", "cupcake")),
    ("fruit market", ("fruit", "fruits", "banana", "bananas", "orange", "oranges", "apple", "apples")),
    ("cooking", ("kitchen", "stove", "oven", "cooking", "chef", "refrigerator", "counter")),
    ("dining", ("plate", "sandwich", "meal", "food", "dinner", "lunch", "breakfast", "bowl", "vegetables")),
    ("bathroom routine", ("bathroom", "toilet", "sink", "shower", "bathtub", "mirror")),
    ("office work", ("laptop", "computer", "keyboard", "desk", "monitor", "office")),
    ("home life", ("living", "couch", "bed", "bedroom", "television", "sofa", "chair", "room")),
    ("phone use", ("phone", "cellphone", "cell")),
    ("city life", ("street", "sidewalk", "city", "building", "buildings", "clock", "sign", "umbrella")),
    ("outdoor leisure", ("park", "beach", "field", "grass", "bench", "water", "snow", "hill")),
]
OTHER_L1 = "everyday scene"

L2_OF: dict[str, str] = {
    "tennis match": "ball sport", "baseball game": "ball sport", "frisbee play": "outdoor play",
    "skiing": "board sport", "surfing": "board sport", "skateboarding": "board sport",
    "rail travel": "public transport", "air travel": "public transport", "street traffic": "road transport",
    "cycling": "road transport", "boating": "water transport",
    "safari": "wildlife", "ranch life": "livestock", "pet care": "companion animal", "bird watching": "wildlife",
    "pizza meal": "meal", "dessert": "meal", "dining": "meal", "fruit market": "grocery", "cooking": "food preparation",
    "bathroom routine": "household", "home life": "household", "office work": "work", "phone use": "communication",
    "city life": "urban life", "outdoor leisure": "outdoor play", OTHER_L1: "daily life",
}
L3_OF: dict[str, str] = {
    "ball sport": "sport", "board sport": "sport", "outdoor play": "recreation",
    "public transport": "transportation", "road transport": "transportation", "water transport": "transportation",
    "wildlife": "nature", "livestock": "agriculture", "companion animal": "domestic life",
    "meal": "nutrition", "grocery": "commerce", "food preparation": "nutrition",
    "household": "domestic life", "work": "economy", "communication": "technology",
    "urban life": "society", "daily life": "society",
}
L4_OF: dict[str, str] = {
    "sport": "human activity", "recreation": "human activity", "transportation": "infrastructure",
    "nature": "natural world", "agriculture": "economy", "domestic life": "human activity",
    "nutrition": "health", "commerce": "economy", "economy": "society", "technology": "civilization",
    "society": "civilization",
}
LIFT = [L2_OF, L3_OF, L4_OF]


def l1_concept(captions: str) -> str:
    """The first theme whose keywords occur in the captions (whole words), else OTHER_L1."""
    words = set(re.findall(r"[a-z]+", captions.lower()))
    return next((theme for theme, keys in L1_KEYWORDS if words.intersection(keys)), OTHER_L1)


def next_concept(previous: str, level: int) -> str:
    """The level-`level` concept above `previous` (level 2..5); unknown names lift to 'human activity'."""
    table = LIFT[level - 2] if 2 <= level <= len(LIFT) + 1 else {}
    return table.get(previous, "human activity" if level < 5 else "civilization")


def _captions(message: str) -> list[str]:
    """The caption lines of a prompt (the block after 'Captions of ...:' up to the first blank line)."""
    found = re.search(r"Captions of [^\n]*:\n(.*?)(?:\n\s*\n|$)", message, re.DOTALL)
    lines = found.group(1).splitlines() if found else []
    return [line.strip().lstrip("-*0123456789.) ").strip() for line in lines if line.strip()]


def answer(message: str) -> dict | None:
    """The reply object for one prompt of the project's prompt sets (concept or generalized captions)."""
    captions = _captions(message)
    wanted = re.search(r"Write (\d+) generalized captions", message)
    if wanted:  # generalized captions keep what the captions say, in plain words, never a concept name
        texts = [c.rstrip(".").lower() for c in captions] or ["a photograph"]
        return {"captions": [texts[i % len(texts)] for i in range(int(wanted.group(1)))]}
    level = re.search(r"level-(\d+) concept", message)
    if level is None:
        return None
    if int(level.group(1)) == 1:
        return {"concept": l1_concept(" ".join(captions))}
    previous = re.search(r'more general than "([^"]+)"', message)
    return {"concept": next_concept(previous.group(1) if previous else OTHER_L1, int(level.group(1)))}
