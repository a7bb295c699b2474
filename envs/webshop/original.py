"""Loader for the original WebShop data files, when a user points to them.

Nothing is downloaded: give the paths of files fetched from the WebShop project.

* products (``items_shuffle_1000.json`` / ``items_shuffle.json``): a JSON list of
  products with ``asin``, ``name``, ``full_description``, ``small_description`` (bullet
  points), ``pricing`` (``"$12.99"`` or a range ``"$9.99 - $14.99"``), ``category``,
  ``query``, ``product_category`` and ``customization_options`` (family -> list of
  ``{"value": ...}``).
* attributes (``items_ins_v2_1000.json`` / ``items_ins_v2.json``): ``{asin: {"attributes":
  [...], ...}}``.
* human instructions (``items_human_ins.json``), optional: ``{asin: [{"instruction",
  "instruction_attributes", "instruction_options"}, ...]}``.

Fields are normalised as WebShop's own loader does (option values lowercased with ``/``
as `` | ``; the first price of a range; no price means $100).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.envs.webshop.catalog import Product
from agentgym.envs.webshop.goals import Goal, price_bound

DEFAULT_PRICE = 100.0
"""WebShop's price for products without pricing."""
GOAL_SHUFFLE_SEED = 233
"""WebShop shuffles human goals with this seed before splitting them."""


def load_products(products_file: str | Path, attributes_file: str | Path | None = None) -> list[Product]:
    """Products of an ``items_shuffle``-style file, with attributes from an
    ``items_ins_v2``-style file where given (products without get none)."""
    raw = json.loads(Path(products_file).read_text())
    attributes = json.loads(Path(attributes_file).read_text()) if attributes_file else {}
    products, seen = [], set()
    for item in raw:
        asin = item.get("asin")
        if not asin or asin in seen:  # WebShop's file repeats a few products
            continue
        seen.add(asin)
        products.append(_product(item, attributes.get(asin, {}).get("attributes", [])))
    if not products:
        raise ValueError(f"{products_file} holds no products")
    return products


def load_human_goals(instructions_file: str | Path, products: Sequence[Product]) -> list[Goal]:
    """Goals from an ``items_human_ins``-style file, shuffled as WebShop does; instructions
    for products not in the catalog, or without attributes, are skipped (as WebShop does)."""
    by_asin = {p.asin: p for p in products}
    raw: dict[str, list[dict[str, Any]]] = json.loads(Path(instructions_file).read_text())
    goals = []
    for asin, instructions in raw.items():
        product = by_asin.get(asin)
        for index, entry in enumerate(instructions if product else []):
            if entry.get("instruction_attributes"):
                goals.append(_human_goal(product, entry, random.Random(f"{asin}/{index}")))
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return goals


def _product(item: dict[str, Any], attributes: list[str]) -> Product:
    bullets = item.get("small_description") or []
    return Product(
        asin=item["asin"],
        title=item.get("name") or item["asin"],
        category=(item.get("category") or "").lower(),
        query=(item.get("query") or "").lower().strip(),
        product_category=item.get("product_category") or "",
        description=item.get("full_description") or "",
        bullet_points=tuple(bullets if isinstance(bullets, list) else [bullets]),
        attributes=tuple(attributes),
        options=_options(item.get("customization_options") or {}),
        price=_price(item.get("pricing")),
        rating=_rating(item.get("average_rating", item.get("rating"))),
    )


def _options(customization: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    options = {}
    for family, contents in customization.items():
        if contents:
            options[family.lower()] = tuple(c["value"].strip().replace("/", " | ").lower() for c in contents)
    return options


def _price(pricing: Any) -> float:
    if isinstance(pricing, int | float):
        return float(pricing)
    prices = [float(p.replace(",", "")) for p in re.findall(r"\$\s*([\d,]+(?:\.\d+)?)", pricing or "")]
    return prices[0] if prices else DEFAULT_PRICE


def _rating(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _human_goal(product: Product, entry: dict[str, Any], rng: random.Random) -> Goal:
    price_upper, price_text = price_bound(product.price, rng)
    return Goal(
        asin=product.asin,
        query=product.query,
        product_category=product.product_category,
        attributes=tuple(entry["instruction_attributes"]),
        options=tuple(o.lower() for o in entry.get("instruction_options") or ()),
        price_upper=price_upper,
        instruction=entry["instruction"].strip().rstrip(".") + price_text,
    )
