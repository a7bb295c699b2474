"""The shop as a real website: HTML pages with forms and links, served by the env server.

Every page is addressed by its task and :class:`~agentgym.envs.webshop.shop.ShopState`::

    /site/                                    tasks to shop for
    /site/{split}/{index}/                    search page (the goal is shown on every page)
    /site/{split}/{index}/search?q=&page=     results
    /site/{split}/{index}/item/{asin}?q=&page=&o=family:value...          item, options
    /site/{split}/{index}/item/{asin}/{description|features|reviews}?...  item details
    POST /site/{split}/{index}/buy            (form: asin, q, page, o...) -> reward page

The site keeps no state (the URL is the state), so people, a browser driven by
Playwright and many concurrent sessions use it alike. Each link's target is computed by
the same transition function as the text mode (:func:`~agentgym.envs.webshop.shop.next_state`),
so both modes are one shop. ``<body>`` carries ``data-page``, ``data-asin`` and
``data-chosen`` for programs; the reward page carries ``#reward[data-reward]``.
"""

from __future__ import annotations

import atexit
import contextlib
import html
import json
import threading
from collections.abc import Iterable
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from agentgym.contract.core import WEB_PREFIX
from agentgym.contract.errors import UnknownTask
from agentgym.contract.inputs import decimal
from agentgym.contract.sites import serve_app
from agentgym.envs.webshop.shop import BACK, BUY, DETAILS, NEXT, PREV, PageModel, ShopState, next_state
from agentgym.envs.webshop.world import World

LANDING_TASKS = 20
"""Tasks per split linked from the landing page."""

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:1rem auto;padding:0 1rem;color:#222}
#instruction{background:#fff7d6;border:1px solid #e5c100;padding:.5rem 1rem;margin-bottom:1rem}
.nav a{margin-right:1rem} .result{margin:.6rem 0} .price{color:#b12704}
a.option{display:inline-block;border:1px solid #999;border-radius:4px;padding:.1rem .5rem;margin:.15rem}
a.option.selected{background:#222;color:#fff} #reward{font-size:1.4rem;font-weight:bold}
"""


def site_router(world: World) -> APIRouter:
    """Routes of the shop website, relative to :data:`~agentgym.contract.core.WEB_PREFIX`."""
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse)
    def landing() -> str:
        return _landing(world)

    @router.get("/world.json")
    def world_info() -> JSONResponse:
        """The catalog fingerprint and split sizes: browser-mode envs check they shop in the same world."""
        splits = {split: len(goals) for split, goals in world.goals.items()}
        return JSONResponse({"fingerprint": world.fingerprint, "splits": splits})

    @router.get("/{split}/{index}/", response_class=HTMLResponse)
    def search_page(split: str, index: int) -> str:
        return _page(world, split, index, ShopState())

    @router.get("/{split}/{index}/search", response_class=HTMLResponse)
    def results_page(split: str, index: int, q: str = "", page: int = Query(1, ge=1)) -> str:
        return _page(world, split, index, ShopState(page="results", query=q, page_no=page))

    @router.get("/{split}/{index}/item/{asin}", response_class=HTMLResponse)
    def item_page(split: str, index: int, asin: str, request: Request) -> str:
        return _page(world, split, index, _item_state(request, asin))

    @router.get("/{split}/{index}/item/{asin}/{detail}", response_class=HTMLResponse)
    def detail_page(split: str, index: int, asin: str, detail: str, request: Request) -> str:
        return _page(world, split, index, _item_state(request, asin, page="detail", detail=detail))

    @router.post("/{split}/{index}/buy", response_class=HTMLResponse)
    async def buy(split: str, index: int, request: Request) -> str:
        form = parse_qs((await request.body()).decode())
        state = ShopState(
            page="done",
            query=form.get("q", [""])[0],
            page_no=_page_number(form.get("page", ["1"])[0]),
            asin=form.get("asin", [""])[0],
            chosen=_chosen(form.get("o", [])),
        )
        return _page(world, split, index, state)

    return router


def _item_state(request: Request, asin: str, page: str = "item", detail: str | None = None) -> ShopState:
    params = request.query_params
    return ShopState(
        page=page,
        query=params.get("q", ""),
        page_no=_page_number(params.get("page", "1")),
        asin=asin,
        chosen=_chosen(params.getlist("o")),
        detail=detail,
    )


def _chosen(pairs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``family:value`` parameters as ShopState's sorted pairs (the last value of a family wins)."""
    chosen = {}
    for pair in pairs:
        family, colon, value = pair.partition(":")
        if colon:
            chosen[family] = value
    return tuple(sorted(chosen.items()))


def _page_number(text: str) -> int:
    """A results page number from a URL or form; anything but a positive integer means 1."""
    return decimal(text) or 1


def _page(world: World, split: str, index: int, state: ShopState) -> str:
    model = world.page_model(world.goal(split, index), state)
    base = f"{WEB_PREFIX}/{split}/{index}"
    body = {
        "search": _search_body,
        "results": _results_body,
        "item": _item_body,
        "detail": _detail_body,
        "done": _done_body,
    }[state.page](model, base)
    chosen = json.dumps(sorted(state.chosen_options().values()))
    return _document(
        f"WebShop - {state.page}",
        f'<div id="instruction">Instruction: {_e(model.instruction)}</div>\n{body}',
        page=state.page,
        asin=state.asin or "",
        chosen=chosen,
    )


def _document(title: str, content: str, **data: str) -> str:
    attributes = " ".join(f'data-{k}="{_e(v)}"' for k, v in data.items())
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_STYLE}</style></head><body {attributes}><main>{content}</main></body></html>"
    )


def state_url(base: str, state: ShopState) -> str:
    """The URL of a page (any page but ``done``, which is reached by the Buy Now form)."""
    if state.page == "search":
        return f"{base}/"
    if state.page == "results":
        return f"{base}/search?" + urlencode({"q": state.query, "page": state.page_no})
    params = urlencode(
        [("q", state.query), ("page", state.page_no), *(("o", f"{f}:{v}") for f, v in state.chosen)]
    )
    detail = f"/{state.detail}" if state.page == "detail" else ""
    return f"{base}/item/{state.asin}{detail}?{params}"


def _link(model: PageModel, base: str, element: str, text: str, css: str = "") -> str:
    target = next_state(model, "click", element)
    css_attr = f' class="{css}"' if css else ""
    return f'<a{css_attr} href="{_e(state_url(base, target))}">{_e(text)}</a>'


def _nav(model: PageModel, base: str) -> str:
    clickables = model.clickables()
    links = [_link(model, base, BACK, "Back to Search")]
    links += [_link(model, base, PREV, "< Prev")] if PREV in clickables else []
    links += [_link(model, base, NEXT, "Next >")] if NEXT in clickables else []
    return f'<div class="nav">{" ".join(links)}</div>'


def _search_body(model: PageModel, base: str) -> str:
    return (
        f'<form action="{base}/search" method="get" role="search">'
        '<input name="q" type="search" aria-label="Search products" size="50" autofocus> '
        '<button type="submit" data-role="search-submit">Search</button></form>'
    )


def _results_body(model: PageModel, base: str) -> str:
    state = model.state
    items = []
    for product in model.page_results:
        link = _link(model, base, product.asin.lower(), product.asin, "asin")
        items.append(
            f'<li class="result">{link}<div>{_e(product.title)}</div>'
            f'<div class="price">${product.price:.2f}</div></li>'
        )
    listing = "".join(items) or "<p>No products match this query; go back to search and try other words.</p>"
    heading = f"<p>Page {state.page_no} (Total results: {len(model.results)})</p>"
    return f"{_nav(model, base)}{heading}<ol>{listing}</ol>"


def _item_body(model: PageModel, base: str) -> str:
    product, chosen = model.product, model.state.chosen_options()
    assert product is not None
    options = []
    for family, values in product.options.items():
        buttons = " ".join(
            _link(model, base, v, v, "option selected" if chosen.get(family) == v else "option")
            for v in values
        )
        options.append(f'<div class="options"><h3>{_e(family)}</h3>{buttons}</div>')
    rating = f"{product.rating:.1f}" if product.rating is not None else "N.A."
    details = " ".join(_link(model, base, d, d.capitalize()) for d in DETAILS)
    hidden = "".join(
        f'<input type="hidden" name="{name}" value="{_e(str(value))}">'
        for name, value in [("asin", product.asin), ("q", model.state.query), ("page", model.state.page_no)]
        + [("o", f"{f}:{v}") for f, v in model.state.chosen]
    )
    return (
        f"{_nav(model, base)}{''.join(options)}<h2>{_e(product.title)}</h2>"
        f'<p class="price">Price: ${product.price:.2f}</p><p>Rating: {rating}</p>'
        f'<div class="nav">{details}</div>'
        f'<form action="{base}/buy" method="post"><button type="submit">{BUY.title()}</button>{hidden}</form>'
    )


def _detail_body(model: PageModel, base: str) -> str:
    product = model.product
    assert product is not None
    detail = model.state.detail
    if detail == "description":
        content = f"<p>{_e(product.description or 'No description.')}</p>"
    elif detail == "features":
        content = "<ul>" + "".join(f"<li>{_e(b)}</li>" for b in product.bullet_points) + "</ul>"
    elif detail == "reviews":
        content = (
            "".join(f"<blockquote>{_e(r)}</blockquote>" for r in product.reviews) or "<p>No reviews yet.</p>"
        )
    else:
        raise UnknownTask(f"no detail page {detail!r}; pages: description, features, reviews")
    return f"{_nav(model, base)}<h2>{_e(product.title)}</h2>{content}"


def _done_body(model: PageModel, base: str) -> str:
    product, reward = model.product, model.reward
    assert product is not None and reward is not None
    chosen = ", ".join(f"{f}: {v}" for f, v in model.state.chosen_options().items()) or "none"
    rows = [
        ("type match", f"{reward.r_type:g}"),
        ("attributes matched", f"{reward.matched_attributes} / {reward.n_attributes}"),
        ("options matched", f"{reward.matched_options} / {reward.n_options}"),
        ("price within bound", "yes" if reward.price_ok else "no"),
    ]
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (
        "<h1>Thank you for shopping with us!</h1>"
        f"<p>Purchased {_e(product.asin)}: {_e(product.title)}</p><p>Options: {_e(chosen)}</p>"
        f'<p id="reward" data-reward="{reward.value!r}">Your score (min 0.0, max 1.0): {reward.value:.4g}</p>'
        f'<table id="reward-parts">{table}</table><p><a href="{base}/">Shop again</a></p>'
    )


def _landing(world: World) -> str:
    sections = []
    for split, goals in world.goals.items():
        links = "".join(
            f'<li><a href="{WEB_PREFIX}/{split}/{i}/">{split} {i}</a>: {_e(goal.instruction)}</li>'
            for i, goal in enumerate(goals[:LANDING_TASKS])
        )
        sections.append(f"<h2>{split} ({len(goals)} tasks)</h2><ul>{links}</ul>")
    return _document("WebShop", "<h1>WebShop</h1>" + "".join(sections), page="landing")


def _e(text: str) -> str:
    return html.escape(text, quote=True)


_local_sites: dict[int, str] = {}
_local_sites_lock = threading.Lock()
_local_servers = contextlib.ExitStack()
atexit.register(_local_servers.close)


def local_site_url(world: World) -> str:
    """Base URL of a loopback server (in a daemon thread) serving ``world``'s site, started
    on first use: browser-mode environments without a ``site_url`` shop there."""
    with _local_sites_lock:
        if id(world) not in _local_sites:
            app = FastAPI(title="AgentGym WebShop site")
            app.include_router(site_router(world), prefix=WEB_PREFIX)
            _local_sites[id(world)] = _local_servers.enter_context(serve_app(app))
        return _local_sites[id(world)]
