"""``WebShopEnv``: shop for a product that fits an instruction (after WebShop, Yao et al. 2022).

Two modes share the catalog, goals, actions and reward:

* ``mode="text"``: the shop runs in memory; observations are WebShop's ``[SEP]`` text.
* ``mode="browser"``: every action is carried out by Playwright in headless chromium on
  the shop's website; observations are the page's visible text.

A bad action (malformed, or an element the page does not have) is answered with an
observation that says why, costs a turn, and leaves the episode running.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from agentgym.contract.cache import cache_dir as agentgym_cache_dir
from agentgym.contract.core import WEB_PREFIX, Task, TaskListsMixin, TextEnv, Transition
from agentgym.contract.dialects import Dialect
from agentgym.contract.errors import EngineError, UnknownTask
from agentgym.contract.inputs import decimal
from agentgym.envs.webshop.browser import BrowserTab, Snapshot, browser_worker
from agentgym.envs.webshop.dialect import WEBSHOP_DIALECT
from agentgym.envs.webshop.goals import Goal
from agentgym.envs.webshop.shop import (
    BadAction,
    PageModel,
    PageView,
    ShopState,
    check_action,
    expert_action,
    next_state,
    parse_action,
    render_text,
    view_of,
)
from agentgym.envs.webshop.site import local_site_url, site_router
from agentgym.envs.webshop.world import CatalogSource, World, shared_world

MODES = ("text", "browser")
SEARCH_ACTION = "search[<query>]"
"""How ``available_actions`` lists the search bar: the query is the agent's to write."""

INSTRUCTION = """\
You are shopping in an online store (WebShop). The first observation states what to buy: \
a kind of product, some of its attributes, options such as size or colour, and a price \
limit. Find the product and buy it with the right options.

Pages: search -> results (10 per page) -> product page (options, description, features, \
reviews) -> Buy Now. Actions, one per turn:
  search[your query]   on the search page, e.g. search[lavender body lotion paraben free]
  click[element]       any clickable element the page lists, e.g. click[b0abc01234], \
click[next >], click[< prev], click[back to search], click[large], click[description], \
click[buy now]

Reply with the action only."""


@dataclass
class Page:
    """What the current page shows the agent, the expert and the reward."""

    observation: str
    view: PageView
    has_search_bar: bool
    reward: float | None = None
    """Set on the page after Buy Now."""
    extra: dict[str, Any] = field(default_factory=dict)


class TextShop:
    """The shop in memory: pages are :class:`ShopState` transitions rendered as WebShop text."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._goal: Goal | None = None
        self._model: PageModel | None = None

    def start(self, goal: Goal, split: str, index: int) -> Page:
        self._goal = goal
        return self._show(ShopState())

    def act(self, verb: str, argument: str) -> Page:
        assert self._model is not None
        return self._show(next_state(self._model, verb, argument))

    def _show(self, state: ShopState) -> Page:
        assert self._goal is not None
        model = self._model = self.world.page_model(self._goal, state)
        reward = model.reward
        if reward is None:
            return Page(render_text(model), view_of(model), model.has_search_bar)
        parts = {"reward_parts": asdict(reward)}
        return Page(render_text(model), view_of(model), model.has_search_bar, reward.value, parts)

    def close(self) -> None:
        """Nothing to free: the world is shared."""


class BrowserShop:
    """The shop's website driven by chromium; the reward is read off the reward page."""

    def __init__(self, world: World, site_url: str | None) -> None:
        self.world = world
        self.site_url = site_url.rstrip("/") if site_url else None
        self._tab: BrowserTab | None = None
        self._snapshot: Snapshot | None = None

    def start(self, goal: Goal, split: str, index: int) -> Page:
        if self._tab is None:
            self.site_url = self.site_url or local_site_url(self.world)
            _require_same_world(self.site_url, self.world)
            self._tab = BrowserTab(browser_worker())
        return self._show(self._tab.goto(f"{self.site_url}{WEB_PREFIX}/{split}/{index}/"))

    def act(self, verb: str, argument: str) -> Page:
        assert self._tab is not None and self._snapshot is not None
        snapshot = self._snapshot
        element = check_action(verb, argument, snapshot.clickables, snapshot.has_search_bar)
        if verb == "search":
            return self._show(self._tab.search(argument))
        return self._show(self._tab.click(snapshot.clickables.index(element)))

    def _show(self, snapshot: Snapshot) -> Page:
        self._snapshot = snapshot
        view = PageView(snapshot.page, snapshot.clickables, snapshot.asin or None, snapshot.chosen)
        return Page(snapshot.text, view, snapshot.has_search_bar, snapshot.reward)

    def close(self) -> None:
        tab, self._tab = self._tab, None
        if tab is not None:
            tab.close()


_checked_sites: set[tuple[str, int]] = set()
"""(site URL, id of the world) pairs already checked: worlds live as long as the process."""


def _require_same_world(site_url: str, world: World) -> None:
    """A site serving another catalog would silently score against other goals: refuse it."""
    if (site_url, id(world)) in _checked_sites:
        return
    try:
        served = httpx.get(f"{site_url}{WEB_PREFIX}/world.json", timeout=30).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise EngineError(f"the WebShop site at {site_url} does not answer: {exc}") from exc
    ours = {split: len(goals) for split, goals in world.goals.items()}
    splits = served.get("splits", {})
    if served.get("fingerprint") != world.fingerprint or any(splits.get(s, 0) < n for s, n in ours.items()):
        raise EngineError(
            f"the WebShop site at {site_url} serves another catalog or fewer goals ({served}; this env: "
            f"{world.fingerprint}, {ours}): start it with the same catalog settings"
        )
    _checked_sites.add((site_url, id(world)))


class WebShopEnv(TaskListsMixin, TextEnv):
    """Args:
    n_products: size of the generated catalog (1k to 100k+).
    catalog_seed: seed of the generated catalog.
    products_file / attributes_file / instructions_file: original WebShop data files
        (``items_shuffle*.json``, ``items_ins_v2*.json``, ``items_human_ins.json``) used
        instead of the generator; goals come from the instructions file when given, else
        they are generated from the loaded products.
    n_train / n_validation / n_test: goals per split (validation goals ask for train
        products, with their own seeds; human goals: validation counts back from the end
        of the instructions file).
    mode: ``"text"`` or ``"browser"`` (Playwright + chromium on the website).
    site_url: browser mode: base URL of a server of this env with the same catalog
        settings (e.g. ``http://127.0.0.1:8102``); default: a loopback site in this process.
    cache_dir: where the search index is kept (default ``$AGENTGYM_CACHE/webshop``).
    max_turns: turn limit (default 15).
    """

    name: ClassVar[str] = "webshop"
    description: ClassVar[str] = (
        "Online shopping after WebShop: search a generated catalog, open products, choose "
        "options and buy what the instruction asks for; text mode or a real browser."
    )
    action_format: ClassVar[str] = "search[query] or click[element], e.g. click[buy now]"
    default_max_turns: ClassVar[int] = 15
    compat_dialect: ClassVar[Dialect] = WEBSHOP_DIALECT

    def __init__(
        self,
        *,
        n_products: int = 10_000,
        catalog_seed: int = 0,
        products_file: str | None = None,
        attributes_file: str | None = None,
        instructions_file: str | None = None,
        n_train: int = 2000,
        n_test: int = 200,
        n_validation: int = 200,
        mode: str = "text",
        site_url: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_turns: int | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        super().__init__(max_turns=max_turns)
        source = CatalogSource(n_products, catalog_seed, products_file, attributes_file, instructions_file)
        cache = Path(cache_dir) if cache_dir is not None else agentgym_cache_dir("webshop")
        self.world = shared_world(source, n_train, n_test, cache, n_validation)
        self._tasks = self.world.tasks  # splits() and tasks() read it (TaskListsMixin)
        self.mode = mode
        self.shop: TextShop | BrowserShop = (
            TextShop(self.world) if mode == "text" else BrowserShop(self.world, site_url)
        )
        self._goal: Goal | None = None
        self._page: Page | None = None

    # ----- catalogue -------------------------------------------------------------------

    def task(self, task_id: str) -> Task:
        """O(1): ids are ``<split>/<index>`` (the base class would index every task per instance,
        and servers build an instance per session)."""
        split, _, index = task_id.partition("/")
        tasks = self.world.tasks.get(split, [])
        number = decimal(index)
        if number is None or number >= len(tasks):
            raise UnknownTask(f"unknown task id {task_id!r} for env {self.name!r}")
        return tasks[number]

    def instruction(self) -> str:
        return INSTRUCTION

    def web_router(self) -> Any:
        """The shop website (see :mod:`~agentgym.envs.webshop.site`), in both modes."""
        return site_router(self.world)

    # ----- episode ---------------------------------------------------------------------

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        # The goal is fixed by the task; ``seed`` only picks a task (base class).
        self._goal = self.world.goal(task.split, task.meta["index"])
        self._page = self.shop.start(self._goal, task.split, task.meta["index"])
        return Transition(self._page.observation, score=0.0)

    def _step(self, action: str) -> Transition:
        assert self._page is not None
        try:
            page = self.shop.act(*parse_action(action))
        except BadAction as exc:
            return Transition(
                f"Invalid action: {exc}. The page is unchanged:\n{self._page.observation}",
                score=0.0,
                extra={"invalid_action": str(exc)},
            )
        self._page = page
        if page.reward is None:
            return Transition(page.observation, score=0.0)
        won = page.reward == 1.0
        return Transition(page.observation, score=page.reward, won=won, lost=not won, extra=page.extra)

    def available_actions(self) -> list[str] | None:
        if self._page is None:
            return None
        search = [SEARCH_ACTION] if self._page.has_search_bar else []
        return search + [f"click[{element}]" for element in self._page.view.clickables]

    def expert_action(self) -> str | None:
        if self._goal is None or self._page is None:
            return None
        return expert_action(self._goal, self.world.by_asin[self._goal.asin], self._page.view)

    def close(self) -> None:
        self.shop.close()
