"""Products and the seeded catalog generator.

``generate_catalog(n, seed)`` builds ``n`` realistic products (1k to 100k+) across the
departments of :mod:`~agentgym.envs.webshop.vocab`: title, description, bullet points,
attributes, options (size, colour, scent, ...), price, rating and reviews. The same
``(n, seed)`` gives the same catalog on every machine, and a larger ``n`` with the same
seed extends the smaller catalog (product ``i`` only depends on ``seed`` and ``i``).
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from agentgym.envs.webshop.vocab import (
    BRAND_SYLLABLES,
    BULLET_TEMPLATES,
    DEPARTMENTS,
    DESCRIPTION_TEMPLATES,
    REVIEW_TEMPLATES,
    Department,
)


@dataclass(frozen=True)
class Product:
    """One product, with WebShop's field meanings."""

    asin: str
    title: str
    category: str
    """Top-level department, e.g. ``beauty``."""
    query: str
    """Product type, e.g. ``body lotion`` (WebShop's ``query``): what the type reward compares."""
    product_category: str
    """Breadcrumb, e.g. ``Beauty & Personal Care › Skin Care › body lotion``."""
    description: str
    bullet_points: tuple[str, ...]
    attributes: tuple[str, ...]
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Option family (``size``, ``color``, ...) -> values offered, all lowercase."""
    price: float = 0.0
    rating: float | None = None
    reviews: tuple[str, ...] = ()

    def search_text(self) -> str:
        """Everything the search index matches besides the title."""
        values = " ".join(v for vs in self.options.values() for v in vs)
        return " ".join(
            [
                self.query,
                self.product_category,
                *self.attributes,
                *self.bullet_points,
                self.description,
                values,
            ]
        )


def generate_catalog(n: int, seed: int = 0) -> list[Product]:
    """``n`` products; titles and ASINs are unique within the catalog."""
    if n < 1:
        raise ValueError(f"a catalog needs at least one product, not {n}")
    products: list[Product] = []
    titles: set[str] = set()
    asins: set[str] = set()
    for index in range(n):
        product = _product(random.Random(f"{seed}/{index}"), index)
        # Titles are drawn from a large space; the rare repeat gets a series number so the
        # expert's title search and people reading results can tell products apart.
        if product.title in titles:
            product = replace(product, title=f"{product.title}, Series {index}")
        assert product.asin not in asins, "ASINs embed the product index, so they never repeat"
        titles.add(product.title)
        asins.add(product.asin)
        products.append(product)
    return products


def _product(rng: random.Random, index: int) -> Product:
    department = rng.choice(DEPARTMENTS)
    product_type = rng.choice(sorted(department.types))
    brand = _brand(rng)
    adjective = rng.choice(department.adjectives)
    attributes = tuple(rng.sample(department.attributes, rng.randint(2, 5)))
    options = _options(rng, department)
    words = {
        "brand": brand,
        "type": product_type,
        "adjective": adjective,
        "department": department.label.lower(),
        "attr0": attributes[0],
        "attr1": attributes[1],
    }
    title = f"{brand} {adjective.title()} {product_type.title()}, {attributes[0].title()}, {attributes[1].title()}"
    return Product(
        asin=_asin(index, rng),
        title=title,
        category=department.name,
        query=product_type,
        product_category=f"{department.label} › {department.types[product_type]} › {product_type}",
        description=rng.choice(DESCRIPTION_TEMPLATES).format(title=title, **words),
        bullet_points=_bullets(rng, attributes, words),
        attributes=attributes,
        options=options,
        price=_price(rng, department),
        rating=None if rng.random() < 0.1 else round(rng.uniform(3.0, 5.0), 1),
        reviews=_reviews(rng, attributes, options, words),
    )


def _brand(rng: random.Random) -> str:
    return "".join(rng.choice(BRAND_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _asin(index: int, rng: random.Random) -> str:
    """``B0`` + three random letters (the real look) + the index in base 36 (uniqueness)."""
    digits = string.digits + string.ascii_uppercase
    encoded = ""
    for _ in range(5):  # 36**5 = 60M products at most
        index, rest = divmod(index, 36)
        encoded = digits[rest] + encoded
    return "B0" + "".join(rng.choice(string.ascii_uppercase) for _ in range(3)) + encoded


def _options(rng: random.Random, department: Department) -> dict[str, tuple[str, ...]]:
    families = rng.sample(sorted(department.options), rng.randint(1, min(3, len(department.options))))
    options = {}
    for family in sorted(families):
        values = department.options[family]
        options[family] = tuple(rng.sample(values, rng.randint(2, min(5, len(values)))))
    return options


def _price(rng: random.Random, department: Department) -> float:
    low, high = department.price
    # Prices cluster low, as in real shops (the square of a uniform draw skews to `low`),
    # and end in .99.
    return math.floor(low + (high - low) * rng.random() ** 2) + 0.99


def _bullets(rng: random.Random, attributes: tuple[str, ...], words: dict[str, str]) -> tuple[str, ...]:
    bullets = []
    for template, attribute in zip(rng.sample(BULLET_TEMPLATES, 4), attributes * 2, strict=False):
        bullets.append(template.format(attr=attribute, Attr=attribute.capitalize(), **words))
    return tuple(bullets)


def _reviews(
    rng: random.Random,
    attributes: tuple[str, ...],
    options: dict[str, tuple[str, ...]],
    words: dict[str, str],
) -> tuple[str, ...]:
    picks = rng.sample(REVIEW_TEMPLATES, rng.randint(0, 3))
    return tuple(t.format(attr=attributes[-1], option=next(iter(options)), **words) for t in picks)
