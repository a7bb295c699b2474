"""Shopping goals (instructions) and WebShop's purchase reward.

A goal is generated from a *target product*: its type, one to three of its attributes,
one value of each of its options and a price bound above its price, worded as a
WebShop-style instruction ("i am looking for ..., and price lower than 40.00 dollars").

Splits: the products whose catalog index is a multiple of :data:`TEST_EVERY` are the
test targets, all others the train targets, so no test goal asks for a product a train
goal asked for. Validation goals ask for train targets too (test's products stay unseen
until the final report), with seeds of their own: goal ``i`` of a split is drawn with its
own seed ``(split seed, i)`` (:data:`SPLIT_SEEDS`, each split at most
:data:`MAX_SPLIT_GOALS` long), so no two splits share a goal seed.

The reward of buying ``product`` with ``chosen`` options for ``goal`` (Yao et al., 2022)::

    r = r_type * (matched attributes + matched options + [price <= bound])
               / (len(goal attributes) + len(goal options) + 1)

``r_type`` (see :func:`type_reward`) is 1 when the product is of the asked type and falls
to 0.5 / 0.1 / 0 as its title shares less of the asked type's words. Success is r == 1.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentgym.envs.webshop.catalog import Product

TEST_EVERY = 5
"""Every fifth product (by catalog index) is a test target; the others are train targets."""
SPLIT_SEEDS = {"train": 0, "validation": 500_000, "test": 1_000_000}
MAX_SPLIT_GOALS = 500_000
"""Goals a split holds at most, so no split's seeds reach the next split's."""
PRICE_STEPS = [10.0 * i for i in range(1, 100)]
"""WebShop's price bounds: multiples of ten dollars."""
NO_PRICE_BOUND = 1_000_000.0
"""Bound of goals whose target costs more than the largest step: any price passes."""

_TEMPLATES = (
    "i am looking for {attrs} {type}{options}",
    "i need {attrs} {type}{options}",
    "find me {attrs} {type}{options}",
    "i want to buy {attrs} {type}{options}",
)


@dataclass(frozen=True)
class Goal:
    """What to buy. ``options`` are option *values* (as WebShop's ``goal_options``)."""

    asin: str
    """The target product: buying it with ``options`` always earns reward 1."""
    query: str
    product_category: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    price_upper: float
    instruction: str


@dataclass(frozen=True)
class Reward:
    """The parts of one purchase's reward; ``value`` is the formula of the module docstring."""

    r_type: float
    matched_attributes: int
    n_attributes: int
    matched_options: int
    n_options: int
    price_ok: bool

    @property
    def value(self) -> float:
        matched = self.matched_attributes + self.matched_options + int(self.price_ok)
        return self.r_type * matched / (self.n_attributes + self.n_options + 1)

    @property
    def success(self) -> bool:
        return self.value == 1.0


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9']+", text.lower()))


def type_reward(goal: Goal, product: Product) -> float:
    """WebShop's ``r_type``: 1 when the product type (query) or breadcrumb matches, or the
    title holds more than 20% of the type's words; 0.5 with some overlap; 0.1 below 10%;
    0 with none."""
    type_words = _words(goal.query)
    title_score = len(type_words & _words(product.title)) / max(len(type_words), 1)
    if product.query == goal.query or product.product_category == goal.product_category or title_score > 0.2:
        return 1.0
    if title_score == 0.0:
        return 0.0
    return 0.1 if title_score < 0.1 else 0.5


def attribute_matches(goal: Goal, product: Product) -> int:
    """Goal attributes the product has: listed among its attributes, or named in its title or
    bullet points (WebShop also credits attributes stated in the text)."""
    listed = {a.lower() for a in product.attributes}
    text = " ".join([product.title, *product.bullet_points]).lower()
    return sum(a.lower() in listed or a.lower() in text for a in goal.attributes)


def purchase_reward(goal: Goal, product: Product, chosen: Mapping[str, str]) -> Reward:
    """The reward of buying ``product`` with ``chosen`` options (family -> value)."""
    chosen_values = {v.lower() for v in chosen.values()}
    return Reward(
        r_type=type_reward(goal, product),
        matched_attributes=attribute_matches(goal, product),
        n_attributes=len(goal.attributes),
        matched_options=sum(o.lower() in chosen_values for o in goal.options),
        n_options=len(goal.options),
        price_ok=product.price <= goal.price_upper,
    )


def split_targets(n_products: int, split: str) -> list[int]:
    """Catalog indices of ``split``'s target products (validation: train's)."""
    if split == "test":
        return list(range(0, n_products, TEST_EVERY))
    return [i for i in range(n_products) if i % TEST_EVERY]


def generate_goals(products: Sequence[Product], split: str, n: int) -> list[Goal]:
    """The first ``n`` goals of ``split`` (growing ``n`` only appends goals)."""
    if split not in SPLIT_SEEDS or not 0 <= n <= MAX_SPLIT_GOALS:
        raise ValueError(
            f"a split ({', '.join(SPLIT_SEEDS)}) holds 0 to {MAX_SPLIT_GOALS} goals, not {split} {n}"
        )
    targets = split_targets(len(products), split)
    if not targets:
        raise ValueError(f"the catalog has no {split} targets; it needs more products")
    return [
        goal_for(products[random.Random(f"{split}/{i}").choice(targets)], SPLIT_SEEDS[split] + i)
        for i in range(n)
    ]


def goal_for(product: Product, seed: int) -> Goal:
    """A goal whose target is ``product``, drawn with ``seed``."""
    rng = random.Random(seed)
    attributes = tuple(rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes)))))
    options = tuple(rng.choice(values) for _, values in sorted(product.options.items()))
    price_upper, price_text = price_bound(product.price, rng)
    template = rng.choice(_TEMPLATES)
    option_text = f" in {' and '.join(options)}" if options else ""
    instruction = template.format(attrs=" and ".join(attributes), type=product.query, options=option_text)
    return Goal(
        asin=product.asin,
        query=product.query,
        product_category=product.product_category,
        attributes=attributes,
        options=options,
        price_upper=price_upper,
        instruction=instruction + price_text,
    )


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """WebShop's rule: of the first four ten-dollar steps above ``price`` take the larger of
    two random ones; with fewer than two steps left, no bound."""
    steps = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps) < 2:
        return NO_PRICE_BOUND, ""
    upper = max(rng.sample(steps, 2))
    return upper, f", and price lower than {upper:.2f} dollars"
