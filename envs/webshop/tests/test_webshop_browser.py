"""WebShop's website in real headless chromium (Playwright, Debian's /usr/bin/chromium):
a click-through purchase checked on the reward page, and the browser-mode env played by
its expert in-process and over REST. One server and one browser serve the whole module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("tantivy")
pytest.importorskip("playwright")

from agentgym.clients.env_client import EnvClient
from agentgym.contract.errors import EngineError
from agentgym.envs.webshop import WebShopEnv
from agentgym.envs.webshop.browser import CHROMIUM, browser_worker
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian chromium at {CHROMIUM}")

SMALL = {"n_products": 1500, "n_train": 40, "n_test": 60}
BROWSER_TASKS = [f"test/{i}" for i in range(6)]


@pytest.fixture(scope="module")
def site_url(agentgym_cache: str) -> Iterator[str]:
    with serve_in_thread(ServerConfig(env="webshop", env_config=SMALL)) as url:
        yield url


@pytest.fixture(scope="module")
def browser_env(site_url: str) -> Iterator[WebShopEnv]:
    env = WebShopEnv(**SMALL, mode="browser", site_url=site_url)
    yield env
    env.close()


def test_click_through_search_item_options_buy(site_url: str) -> None:
    """Drive the site as a person would: type, submit, click links, press Buy Now."""
    world = WebShopEnv(**SMALL).world
    goal = world.goal("test", 7)
    target = world.by_asin[goal.asin]

    def shop(browser: Any) -> dict[str, Any]:
        page = browser.new_page()
        try:
            page.goto(f"{site_url}/site/test/7/")
            assert goal.instruction in page.inner_text("#instruction")
            page.fill("input[name=q]", target.title)
            page.click("button[type=submit]")
            page.wait_for_selector("body[data-page=results]")
            page.click(f"a.asin:text-is('{target.asin}')")
            page.wait_for_selector("body[data-page=item]")
            for value in goal.options:
                page.click(f"a.option:text-is('{value}')")
                page.wait_for_selector(f"a.option.selected:text-is('{value}')")
            page.click("button:text-is('Buy Now')")
            page.wait_for_selector("#reward")
            return {
                "reward": page.get_attribute("#reward", "data-reward"),
                "text": page.inner_text("main"),
                "url": page.url,
            }
        finally:
            page.close()

    seen = browser_worker().call(shop, browser_worker().browser)
    assert seen["reward"] == "1.0" and seen["url"].endswith("/site/test/7/buy")
    assert "Your score (min 0.0, max 1.0): 1" in seen["text"]
    assert f"Purchased {target.asin}" in seen["text"] and "attributes matched" in seen["text"]


def test_browser_mode_expert(browser_env: WebShopEnv) -> None:
    for task_id in BROWSER_TASKS:
        observation, info = browser_env.reset(task_id=task_id)
        assert browser_env.world.goal("test", int(task_id.split("/")[1])).instruction in observation
        total = 0.0
        while not browser_env.done:
            observation, reward, terminated, _, info = browser_env.step(browser_env.expert_action())
            total += reward
        assert terminated and info["success"] and total == 1.0, task_id
        assert "Your score (min 0.0, max 1.0): 1" in observation


def test_browser_mode_bad_actions(browser_env: WebShopEnv) -> None:
    observation, info = browser_env.reset(task_id="test/0")
    observation, reward, terminated, truncated, info = browser_env.step("click[buy now]")
    assert observation.startswith("Invalid action") and "not a clickable element" in observation
    assert info["turn"] == 1 and not (terminated or truncated) and reward == 0.0
    observation, *_, info = browser_env.step("search[coffee]")
    assert "Total results" in observation and "click[back to search]" in info["available_actions"]
    observation, *_, info = browser_env.step("search[tea]")
    assert "no search bar" in observation and info["turn"] == 3
    observation, *_, info = browser_env.step("click[Back to Search]")
    assert info["available_actions"] == ["search[<query>]"]


def test_browser_mode_over_rest(agentgym_cache: str) -> None:
    """A server whose sessions browse: the env starts its own loopback site."""
    config = ServerConfig(env="webshop", env_config={**SMALL, "mode": "browser"})
    with serve_in_thread(config) as url, EnvClient(url) as client:
        created = client.create("test/8")
        info, session = created.info, created.session_id
        while "expert_action" in info:
            result = client.step(session, info["expert_action"])
            info = result.info
        assert result.terminated and info["success"]
        client.delete(session)


def test_browser_mode_refuses_a_site_with_another_catalog(site_url: str) -> None:
    env = WebShopEnv(n_products=1000, n_train=5, n_test=5, mode="browser", site_url=site_url)
    with pytest.raises(EngineError, match="serves another catalog or fewer goals"):
        env.reset(task_id="test/0")
    more_goals = WebShopEnv(**{**SMALL, "n_test": 100}, mode="browser", site_url=site_url)
    with pytest.raises(EngineError, match="serves another catalog or fewer goals"):
        more_goals.reset(task_id="test/80")
