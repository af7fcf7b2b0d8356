"""The generators' word lists, written by the team for this project (not taken from any paper's data). Every entry
is one token for the bundled SmolLM2's tokenizer as the generators use it (``tests/test_circuits_datasets.py``
checks each generator's pairs)."""

from __future__ import annotations

NAMES: tuple[str, ...] = (
    "Mary", "John", "Anna", "James", "Sarah", "David", "Emma", "Michael", "Laura", "Peter", "Alice", "Robert",
    "Kate", "Paul", "Lucy", "Mark", "Jane", "Tom", "Rachel", "Daniel", "Susan", "Chris", "Helen", "Steve", "Grace",
    "Adam", "Ruth", "Jack", "Lisa", "Frank", "Amy", "Henry", "Claire", "George", "Nina", "Sam", "Julia", "Martin",
    "Simon", "Eva", "Victor", "Sophie", "Oscar", "Diana", "Leo", "Hannah", "Ben", "Clara", "Carl", "Emily",
    "Tony", "Ella", "Greg", "Maria", "Kevin", "Sara", "Ryan", "Alex", "Olivia", "Jason", "Dan", "Ann", "Joe", "Eric",
    "Karen", "Tim", "Amanda", "Andrew", "Jessica", "Brian", "Nancy", "Scott", "Ivan", "Lily", "Hugo", "Iris",
    "Felix", "Marie", "Jim", "Kelly", "Ted", "Ian", "Judy",
)
"""First names for the IOI prompts."""

PLACES: tuple[str, ...] = (
    "store", "park", "school", "office", "beach", "station", "garden", "library", "market", "hospital", "museum",
    "restaurant", "church", "house", "kitchen", "bank", "farm", "river", "lake", "theater", "airport", "hotel",
    "shop", "zoo", "gym", "mall", "castle", "forest", "island",
)

OBJECTS: tuple[str, ...] = (
    "drink", "book", "ring", "letter", "gift", "ball", "key", "cake", "pen", "bag", "coin", "flower", "hat", "phone",
    "card", "cup", "map", "box", "toy", "bottle", "basket",
)
"""What one person gives another; each starts with a consonant, after "a"."""

IOI_TEMPLATES: tuple[str, ...] = (
    "When {a} and {b} went to the {place} together, {s} gave a {thing} to",
    "While {a} and {b} were working at the {place}, {s} passed a {thing} to",
    "Once {a} and {b} had walked to the {place}, {s} brought a {thing} to",
    "Since {a} and {b} were both at the {place}, {s} offered a {thing} to",
    "After {a} and {b} arrived at the {place} early, {s} handed a {thing} to",
)
"""Fifteen tokens each once filled: the first two names, the place, the subject (the second mention) and the thing."""

GREATER_THAN_NOUNS: tuple[str, ...] = (
    "war", "expedition", "drought", "reign", "strike", "festival", "siege", "famine", "treaty", "voyage",
    "contract", "project", "occupation", "rebellion", "boom",
)
GREATER_THAN_TEMPLATE = "The {noun} lasted from the year {century}{start} to the year {century}"
"""Digits are one token each for SmolLM2, so the next token is the end year's tens digit."""
CENTURIES: tuple[str, ...] = ("14", "15", "16", "17", "18")

INDUCTION_WORDS: tuple[str, ...] = (
    "apple", "river", "chair", "window", "doctor", "engine", "forest", "orange", "wallet", "yellow", "castle",
    "finger", "anchor", "bridge", "nest", "ocean", "cloud", "stone", "paper", "music", "horse", "table", "shirt",
    "clock", "train", "bread", "plate", "sugar", "winter", "summer", "metal", "glass", "water", "fire", "sand",
    "snow", "rain", "wind", "storm", "light", "dream", "voice", "letter", "number", "circle", "square", "market",
    "planet",
)
"""One token with and without a leading space (the first word of a prompt has none)."""

CAPITALS: dict[str, str] = {
    "France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin", "Japan": "Tokyo", "Russia": "Moscow",
    "Egypt": "Cairo", "England": "London", "Greece": "Athens", "Canada": "Ottawa", "China": "Beijing",
    "Austria": "Vienna", "Ireland": "Dublin", "Poland": "Warsaw", "Norway": "Oslo", "Portugal": "Lisbon",
    "Sweden": "Stockholm", "Kenya": "Nairobi", "Peru": "Lima", "Cuba": "Havana", "Korea": "Seoul",
    "Iran": "Tehran", "Chile": "Santiago", "Hungary": "Budapest", "Denmark": "Copenhagen", "Finland": "Helsinki",
    "Syria": "Damascus", "Iraq": "Baghdad",
}
LANGUAGES: dict[str, str] = {
    "France": "French", "Italy": "Italian", "Spain": "Spanish", "Germany": "German", "Japan": "Japanese",
    "Russia": "Russian", "China": "Chinese", "Greece": "Greek", "Poland": "Polish", "Sweden": "Swedish",
    "Turkey": "Turkish", "Korea": "Korean", "Egypt": "Arabic", "Mexico": "Spanish", "Norway": "Norwegian",
    "Finland": "Finnish", "Hungary": "Hungarian", "Denmark": "Danish", "Israel": "Hebrew", "Netherlands": "Dutch",
}
FACT_RELATIONS: tuple[tuple[str, dict[str, str]], ...] = (
    ("The capital city of {subject} is", CAPITALS),
    ("The official language of {subject} is", LANGUAGES),
)
"""(template, subject -> object): six tokens each once filled, the object one token after a space."""
