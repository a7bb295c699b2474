"""The shop's pages as a state machine, their WebShop text rendering, and the expert.

Pages: ``search`` -> ``results`` (10 per page, top 50) -> ``item`` (options, with
``detail`` sub-pages description / features / reviews) -> ``done`` (after Buy Now).
A :class:`ShopState` names a page completely (query, page number, product, chosen
options), so the website encodes it in URLs and the text mode keeps it in memory: both
render the same :class:`PageModel`.

Actions are WebShop's: ``search[query]`` on the search page and ``click[element]`` with
an element listed in :meth:`PageModel.clickables` (case-insensitive).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agentgym.envs.webshop.catalog import Product
from agentgym.envs.webshop.goals import Goal, Reward

RESULTS_PER_PAGE = 10
MAX_RESULTS = 50
"""WebShop shows the top 50 results, five pages of ten."""
DETAILS = ("description", "features", "reviews")
BACK, PREV, NEXT, BUY = "back to search", "< prev", "next >", "buy now"
SEP = " [SEP] "

_ACTION = re.compile(r"^(search|click)\s*\[(.*)\]$", re.IGNORECASE | re.DOTALL)


class BadAction(Exception):
    """An action the current page cannot take; the message says why and what would work."""


@dataclass(frozen=True)
class ShopState:
    """Which page is shown, completely: the website puts these fields in its URLs."""

    page: str = "search"
    query: str = ""
    page_no: int = 1
    asin: str | None = None
    chosen: tuple[tuple[str, str], ...] = ()
    """Chosen options as sorted ``(family, value)`` pairs."""
    detail: str | None = None

    def chosen_options(self) -> dict[str, str]:
        return dict(self.chosen)

    def choose(self, family: str, value: str) -> ShopState:
        return replace(self, chosen=tuple(sorted({**self.chosen_options(), family: value}.items())))


@dataclass
class PageModel:
    """Everything one page shows; rendered as WebShop text here and as HTML by the site."""

    state: ShopState
    instruction: str
    results: Sequence[Product] = ()
    """All results of the query (at most :data:`MAX_RESULTS`), not only this page's."""
    product: Product | None = None
    reward: Reward | None = None

    @property
    def page_results(self) -> Sequence[Product]:
        start = (self.state.page_no - 1) * RESULTS_PER_PAGE
        return self.results[start : start + RESULTS_PER_PAGE]

    @property
    def has_next(self) -> bool:
        return self.state.page_no * RESULTS_PER_PAGE < len(self.results)

    def clickables(self) -> list[str]:
        """The clickable elements, lowercase, in page order (WebShop's ``clickables``)."""
        page = self.state.page
        if page == "results":
            return [
                BACK,
                *([PREV] if self.state.page_no > 1 else []),
                *([NEXT] if self.has_next else []),
                *(p.asin.lower() for p in self.page_results),
            ]
        if page == "item":
            assert self.product is not None
            values = [v for vs in self.product.options.values() for v in vs]
            return [BACK, PREV, *values, *DETAILS, BUY]
        if page == "detail":
            return [BACK, PREV]
        return []

    @property
    def has_search_bar(self) -> bool:
        return self.state.page == "search"


def parse_action(action: str) -> tuple[str, str]:
    """``("search" | "click", argument)``; :class:`BadAction` for any other shape."""
    match = _ACTION.match(action.strip())
    if not match:
        raise BadAction(
            f"cannot parse {action!r}: actions are search[your query] on the search page or "
            "click[element] with an element from the list of clickable elements"
        )
    return match.group(1).lower(), " ".join(match.group(2).split())


def next_state(model: PageModel, verb: str, argument: str) -> ShopState:
    """The state an action leads to, before a purchase is scored; :class:`BadAction` if
    this page cannot take it."""
    element = check_action(verb, argument, model.clickables(), model.has_search_bar)
    if verb == "search":
        return ShopState(page="results", query=argument)
    return _click(model, model.state, element)


def check_action(verb: str, argument: str, clickables: Sequence[str], has_search_bar: bool) -> str:
    """The action's element (lowercase) when a page with these elements can take it;
    :class:`BadAction` saying why not otherwise."""
    if verb == "search":
        if not has_search_bar:
            raise BadAction(f"there is no search bar on this page; click[{BACK}] first")
        if not argument:
            raise BadAction("the search query is empty: write search[words describing the product]")
        return argument
    element = argument.lower()
    if element not in clickables:
        listed = ", ".join(clickables) if clickables else "none (use search[...])"
        raise BadAction(f"{argument!r} is not a clickable element on this page; clickable: {listed}")
    return element


def _click(model: PageModel, state: ShopState, element: str) -> ShopState:
    if element == BACK:
        return ShopState()
    if element == NEXT:
        return replace(state, page_no=state.page_no + 1)
    if element == PREV:
        if state.page == "results":
            return replace(state, page_no=state.page_no - 1)
        if state.page == "detail":
            return replace(state, page="item", detail=None)
        return replace(state, page="results", asin=None, chosen=())
    if element == BUY:
        return replace(state, page="done", detail=None)
    if element in DETAILS:
        return replace(state, page="detail", detail=element)
    if state.page == "results":
        asin = next(p.asin for p in model.page_results if p.asin.lower() == element)
        return replace(state, page="item", asin=asin, chosen=())
    assert model.product is not None
    family = next(f for f, values in model.product.options.items() if element in values)
    return state.choose(family, element)


# ----- WebShop's text rendering ---------------------------------------------------------


def render_text(model: PageModel) -> str:
    """The page in WebShop's ``text`` observation format (fields joined by `` [SEP] ``)."""
    state = model.state
    head = ["Instruction:", model.instruction]
    if state.page == "search":
        return SEP.join(["WebShop", *head, "Search"])
    if state.page == "results":
        return SEP.join(head + _results_text(model))
    if state.page == "item":
        return SEP.join(head + _item_text(model))
    if state.page == "detail":
        return SEP.join([*head, "Back to Search", "< Prev", _detail_text(model)])
    return SEP.join(_done_text(model))


def _results_text(model: PageModel) -> list[str]:
    state = model.state
    parts = ["Back to Search", f"Page {state.page_no} (Total results: {len(model.results)})"]
    parts += ["< Prev"] if state.page_no > 1 else []
    parts += ["Next >"] if model.has_next else []
    for product in model.page_results:
        parts += [product.asin, product.title, f"${product.price:.2f}"]
    if not model.results:
        parts.append("No products match this query; go back to search and try other words.")
    return parts


def _item_text(model: PageModel) -> list[str]:
    product = model.product
    assert product is not None
    parts = ["Back to Search", "< Prev"]
    for family, values in product.options.items():
        parts += [family, *values]
    chosen = model.state.chosen_options()
    if chosen:
        parts.append("Selected: " + ", ".join(f"{f}: {v}" for f, v in chosen.items()))
    rating = f"{product.rating:.1f}" if product.rating is not None else "N.A."
    price = f"Price: ${product.price:.2f}"
    return [
        *parts,
        product.title,
        price,
        f"Rating: {rating}",
        "Description",
        "Features",
        "Reviews",
        "Buy Now",
    ]


def _detail_text(model: PageModel) -> str:
    product = model.product
    assert product is not None
    if model.state.detail == "description":
        return product.description or "No description."
    if model.state.detail == "features":
        return SEP.join(product.bullet_points) or "No features listed."
    return SEP.join(product.reviews) or "No reviews yet."


def _done_text(model: PageModel) -> list[str]:
    product, reward = model.product, model.reward
    assert product is not None and reward is not None
    chosen = ", ".join(f"{f}: {v}" for f, v in model.state.chosen_options().items()) or "none"
    return [
        "Thank you for shopping with us!",
        "Purchased",
        product.asin,
        product.title,
        f"Options: {chosen}",
        "Your score (min 0.0, max 1.0)",
        f"{reward.value:.4g}",
    ]


# ----- the expert -----------------------------------------------------------------------


@dataclass(frozen=True)
class PageView:
    """What the expert needs to see of a page (from a :class:`PageModel` or a browser's DOM)."""

    page: str
    clickables: Sequence[str]
    asin: str | None = None
    chosen_values: frozenset[str] = frozenset()


def view_of(model: PageModel) -> PageView:
    chosen = frozenset(model.state.chosen_options().values())
    return PageView(model.state.page, model.clickables(), model.state.asin, chosen)


def expert_action(goal: Goal, target: Product, view: PageView) -> str | None:
    """The oracle's next action: search the target's title, open the target (paging on if
    needed), choose each goal option, buy. ``None`` once the purchase is made."""
    if view.page == "search":
        return f"search[{target.title.lower()}]"
    if view.page == "results":
        if target.asin.lower() in view.clickables:
            return f"click[{target.asin.lower()}]"
        return f"click[{NEXT}]" if NEXT in view.clickables else f"click[{BACK}]"
    if view.page == "item":
        if (view.asin or "").upper() != target.asin.upper():
            return f"click[{PREV}]"
        for value in goal.options:
            if value not in view.chosen_values and value in view.clickables:
                return f"click[{value}]"
        return f"click[{BUY}]"
    if view.page == "detail":
        return f"click[{PREV}]"
    return None
