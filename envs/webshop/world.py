"""The shared shop: catalog, search index and goals, built once per process and config.

A server builds one environment instance per session; they all share one :class:`World`
(products, index and goals are read-only), so a session costs a few objects, not a
catalog. The index lives on disk under the cache folder and survives restarts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from agentgym.contract.core import Task
from agentgym.contract.errors import UnknownTask
from agentgym.envs.webshop.catalog import Product, generate_catalog
from agentgym.envs.webshop.goals import Goal, generate_goals, purchase_reward
from agentgym.envs.webshop.original import load_human_goals, load_products
from agentgym.envs.webshop.search import INDEX_LAYOUT, SearchIndex
from agentgym.envs.webshop.shop import MAX_RESULTS, PageModel, ShopState

GENERATOR_VERSION = "1"
"""Bump when the generator's output changes, so cached indexes of old catalogs are not reused."""
SPLITS = ("train", "test", "validation")
"""In the order the wire numbers them split after split (validation came last)."""
SEARCH_CACHE = 4096
"""Queries whose results are kept in memory per world."""


@dataclass(frozen=True)
class CatalogSource:
    """Where products and goals come from: the generator, or original WebShop files."""

    n_products: int = 10_000
    seed: int = 0
    products_file: str | None = None
    attributes_file: str | None = None
    instructions_file: str | None = None

    def fingerprint(self) -> str:
        """Changes whenever the catalog would: the generator's inputs, or the files' sizes and times."""
        spec = asdict(self) | {"generator": GENERATOR_VERSION, "index": INDEX_LAYOUT}
        for key in ("products_file", "attributes_file", "instructions_file"):
            if spec[key]:
                stat = os.stat(spec[key])
                spec[key] = [os.path.abspath(spec[key]), stat.st_size, stat.st_mtime_ns]
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    def products(self) -> list[Product]:
        if self.products_file:
            return load_products(self.products_file, self.attributes_file)
        return generate_catalog(self.n_products, self.seed)


class World:
    """One catalog with its index and its goals per split."""

    def __init__(
        self, source: CatalogSource, n_train: int, n_test: int, cache_dir: Path, n_validation: int = 0
    ) -> None:
        self.source = source
        self.fingerprint = source.fingerprint()
        self.products = source.products()
        self.by_asin = {p.asin: p for p in self.products}
        self.index = SearchIndex(self.products, cache_dir / f"index-{self.fingerprint}")
        self.goals = self._goals(n_train, n_test, n_validation)
        self.tasks = {split: _split_tasks(split, goals) for split, goals in self.goals.items()}
        # Agents repeat queries (paging back and forth, the expert's title searches across
        # episodes); results are immutable, so repeats are answered from memory.
        self.search = functools.lru_cache(maxsize=SEARCH_CACHE)(self.index.search)

    def _goals(self, n_train: int, n_test: int, n_validation: int) -> dict[str, list[Goal]]:
        if self.source.instructions_file:
            # Human goals come as one shuffled list: test first, as in WebShop, then train;
            # validation counts back from the list's end (goal i is the (i+1)-th last, so
            # growing it only appends) and stops where train's goals end.
            human = load_human_goals(self.source.instructions_file, self.products)
            train = human[n_test : n_test + n_train]
            last = len(human) - 1
            used = min(len(human), n_test + n_train)
            validation = [human[last - i] for i in range(min(n_validation, len(human) - used))]
            return {"train": train, "test": human[:n_test], "validation": validation}
        sizes = (("train", n_train), ("test", n_test), ("validation", n_validation))
        return {split: generate_goals(self.products, split, n) for split, n in sizes}

    def goal(self, split: str, index: int) -> Goal:
        goals = self.goals.get(split)
        if goals is None or not 0 <= index < len(goals):
            raise UnknownTask(f"no goal {index} in split {split!r}")
        return goals[index]

    def page_model(self, goal: Goal, state: ShopState) -> PageModel:
        """What page ``state`` shows for ``goal`` (UnknownTask for a product not in the catalog)."""
        results = self.search(state.query, MAX_RESULTS) if state.page == "results" else []
        product = self.by_asin.get(state.asin or "")
        if state.page in ("item", "detail", "done") and product is None:
            raise UnknownTask(f"no product {state.asin!r} in the catalog")
        reward = purchase_reward(goal, product, state.chosen_options()) if state.page == "done" else None
        return PageModel(state, goal.instruction, results, product, reward)


def _split_tasks(split: str, goals: list[Goal]) -> list[Task]:
    """Task ids read ``<split>/<index>``; ``meta`` holds the index and the instruction."""
    return [
        Task(f"{split}/{index}", split, {"index": index, "instruction": goal.instruction})
        for index, goal in enumerate(goals)
    ]


_worlds: dict[tuple, World] = {}
_worlds_lock = threading.Lock()


def shared_world(
    source: CatalogSource, n_train: int, n_test: int, cache_dir: Path, n_validation: int = 0
) -> World:
    """The process-wide world of this config, built on first use (once, even when many
    sessions start at the same moment)."""
    key = (source, n_train, n_test, n_validation, str(cache_dir))
    with _worlds_lock:
        if key not in _worlds:
            _worlds[key] = World(source, n_train, n_test, cache_dir, n_validation)
        return _worlds[key]
