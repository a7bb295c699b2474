"""WebShop in text mode, on real components: the generated catalog, a real tantivy index
cached on disk, a real env server on loopback (REST, compat routes, the HTML site), the
reward formula on hand-computed cases, and the loader for original WebShop files."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

pytest.importorskip("tantivy")

from agentgym.clients.env_client import EnvClient
from agentgym.envs.webshop import WebShopEnv
from agentgym.envs.webshop.catalog import Product, generate_catalog
from agentgym.envs.webshop.goals import (
    NO_PRICE_BOUND,
    Goal,
    generate_goals,
    purchase_reward,
    split_targets,
    type_reward,
)
from agentgym.envs.webshop.original import load_human_goals, load_products
from agentgym.envs.webshop.search import SearchIndex
from agentgym.envs.webshop.vocab import DEPARTMENTS
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread

SMALL = {"n_products": 1500, "n_train": 40, "n_test": 60}


@pytest.fixture(scope="module")
def webshop_url(agentgym_cache: str) -> Iterator[str]:
    with serve_in_thread(ServerConfig(env="webshop", env_config=SMALL, max_sessions=64)) as url:
        yield url


@pytest.fixture(scope="module")
def env(agentgym_cache: str) -> WebShopEnv:
    return WebShopEnv(**SMALL)


# ----- the reward formula ---------------------------------------------------------------

LOTION = Product(
    asin="B0TEST0001",
    title="Lumora Hydrating Body Lotion, Paraben Free, Long Lasting",
    category="beauty",
    query="body lotion",
    product_category="Beauty & Personal Care › Skin Care › body lotion",
    description="A lotion.",
    bullet_points=("Vegan: thoughtfully designed to be vegan for daily use",),
    attributes=("paraben free", "long lasting", "travel size"),
    options={"scent": ("lavender", "rose"), "size": ("8 fl oz", "16 fl oz")},
    price=18.99,
)
GOAL = Goal(
    asin=LOTION.asin,
    query="body lotion",
    product_category=LOTION.product_category,
    attributes=("paraben free", "travel size"),
    options=("lavender", "16 fl oz"),
    price_upper=30.0,
    instruction="i need paraben free and travel size body lotion in lavender and 16 fl oz",
)


def test_reward_all_matched_is_one() -> None:
    reward = purchase_reward(GOAL, LOTION, {"scent": "lavender", "size": "16 fl oz"})
    assert reward.value == 1.0 and reward.success


def test_reward_counts_each_part() -> None:
    # (2 attributes + 1 of 2 options + price ok) / (2 + 2 + 1) = 4/5
    one_option = purchase_reward(GOAL, LOTION, {"scent": "rose", "size": "16 fl oz"})
    assert one_option.value == pytest.approx(4 / 5) and not one_option.success
    # no options chosen, price over the bound: 2 / 5
    over_price = purchase_reward(replace(GOAL, price_upper=10.0), LOTION, {})
    assert (over_price.matched_options, over_price.price_ok) == (0, False)
    assert over_price.value == pytest.approx(2 / 5)
    # an attribute the product lacks: (2 + 2 + 1) / (3 + 2 + 1) = 5/6
    extra_attribute = replace(GOAL, attributes=("paraben free", "machine wash", "long lasting"))
    partial = purchase_reward(extra_attribute, LOTION, {"scent": "lavender", "size": "16 fl oz"})
    assert partial.matched_attributes == 2 and partial.value == pytest.approx(5 / 6)


def test_reward_credits_attributes_named_in_title_or_bullets() -> None:
    goal = replace(GOAL, attributes=("hydrating", "vegan"), options=())
    assert purchase_reward(goal, LOTION, {}).value == 1.0  # (2 + 0 + 1) / (2 + 0 + 1)


def test_type_reward_levels() -> None:
    other = replace(LOTION, query="shampoo", product_category="Beauty › Hair Care › shampoo")
    assert type_reward(GOAL, LOTION) == 1.0
    assert type_reward(GOAL, other) == 1.0  # the title still names "body lotion"
    long_type = replace(GOAL, query="organic lavender scented body lotion for very dry skin")
    assert type_reward(long_type, replace(other, title="Zen Lotion")) == 0.5  # 1 of 9 words
    longer = replace(GOAL, query="a b c d e f g h i j lotion")
    assert type_reward(longer, replace(other, title="Zen Lotion")) == 0.1  # 1 of 11 words
    assert type_reward(GOAL, replace(other, title="Zen Shampoo")) == 0.0
    # the type factor multiplies the rest: everything else matched, half the reward
    reward = purchase_reward(long_type, replace(other, title="Zen Lotion, Paraben Free, Travel Size"), {})
    assert reward.value == pytest.approx(0.5 * 3 / 5)


# ----- catalog, goals, index ------------------------------------------------------------


def test_generator_is_seeded_unique_and_extends() -> None:
    small, large = generate_catalog(300, seed=3), generate_catalog(600, seed=3)
    assert small == large[:300]
    assert generate_catalog(300, seed=4) != small
    assert len({p.asin for p in large}) == len({p.title for p in large}) == 600
    assert len({p.category for p in large}) == len(DEPARTMENTS) >= 10
    for product in large:
        assert product.title and product.description and product.bullet_points and product.attributes
        assert product.options and all(len(values) >= 2 for values in product.options.values())
        assert product.price > 0 and re.fullmatch(r"B0[A-Z0-9]{8}", product.asin)


def test_option_values_name_one_family_per_department() -> None:
    for department in DEPARTMENTS:
        values = [v for vs in department.options.values() for v in vs]
        assert len(values) == len(set(values)), department.name


def test_goals_come_from_their_target_and_splits_are_disjoint() -> None:
    products = generate_catalog(500)
    by_asin = {p.asin: p for p in products}
    train, test = generate_goals(products, "train", 200), generate_goals(products, "test", 100)
    assert generate_goals(products, "test", 50) == test[:50]
    assert not {g.asin for g in train} & {g.asin for g in test}
    test_asins = {products[i].asin for i in split_targets(500, "test")}
    assert {g.asin for g in test} <= test_asins
    for goal in train + test:
        target = by_asin[goal.asin]
        assert set(goal.attributes) <= set(target.attributes) and goal.query in goal.instruction
        assert len(goal.options) == len(target.options)
        assert all(any(o in values for values in target.options.values()) for o in goal.options)
        assert target.price <= goal.price_upper
        if goal.price_upper != NO_PRICE_BOUND:
            assert f"price lower than {goal.price_upper:.2f} dollars" in goal.instruction


def test_index_is_built_once_and_reopened(tmp_path: Path) -> None:
    products = generate_catalog(400)
    folder = tmp_path / "index"
    first = SearchIndex(products, folder)
    built = (folder / "meta.json").stat().st_mtime_ns
    again = SearchIndex(products, folder)
    assert (folder / "meta.json").stat().st_mtime_ns == built
    assert [p.asin for p in again.search("lotion")] == [p.asin for p in first.search("lotion")]
    for product in products[:50]:
        assert again.search(product.title)[0].asin == product.asin
    assert again.search("!!! ???") == []
    assert all("lotion" in p.search_text().lower() + p.title.lower() for p in again.search("lotion"))


# ----- episodes over REST ---------------------------------------------------------------


def play_expert(client: EnvClient, task_id: str) -> tuple[float, dict, int]:
    created = client.create(task_id)
    info, total, turns = created.info, 0.0, 0
    while "expert_action" in info:
        action = info["expert_action"]
        assert action in info["available_actions"] or action.startswith("search[")
        result = client.step(created.session_id, info["expert_action"])
        info, total, turns = result.info, total + result.reward, turns + 1
    client.delete(created.session_id)
    return total, info, turns


def test_expert_solves_every_test_task_over_rest(webshop_url: str) -> None:
    with EnvClient(webshop_url) as client:
        tasks = client.tasks("test", limit=1000).tasks
        assert len(tasks) == SMALL["n_test"]
        for task in tasks:
            total, info, turns = play_expert(client, task.task_id)
            assert info["success"] and total == pytest.approx(1.0), task.task_id
            assert info["reward_parts"]["r_type"] == 1.0 and turns <= 8


def test_first_observation_is_webshop_text(env: WebShopEnv) -> None:
    observation, info = env.reset(task_id="test/3")
    goal = env.world.goal("test", 3)
    assert observation == f"WebShop [SEP] Instruction: [SEP] {goal.instruction} [SEP] Search"
    assert info["available_actions"] == ["search[<query>]"]
    observation, *_, info = env.step(info["expert_action"])
    assert observation.startswith(f"Instruction: [SEP] {goal.instruction} [SEP] Back to Search [SEP] Page 1")
    assert goal.asin in observation and f"click[{goal.asin.lower()}]" in info["available_actions"]


def test_paging_and_item_pages(env: WebShopEnv) -> None:
    env.reset(task_id="test/0")
    observation, *_, info = env.step("search[lotion]")
    assert "Page 1 (Total results: " in observation and "click[next >]" in info["available_actions"]
    observation, *_, info = env.step("click[Next >]")  # case does not matter
    assert "Page 2 " in observation and "click[< prev]" in info["available_actions"]
    asin = next(a for a in info["available_actions"] if re.fullmatch(r"click\[b0\w{8}\]", a))
    observation, *_, info = env.step(asin)
    assert {"click[description]", "click[features]", "click[reviews]", "click[buy now]"} <= set(
        info["available_actions"]
    )
    observation, *_, info = env.step("click[features]")
    assert info["available_actions"] == ["click[back to search]", "click[< prev]"]
    observation, *_, info = env.step("click[< prev]")
    assert "Buy Now" in observation
    observation, *_, info = env.step("click[< prev]")
    assert "Page 2 " in observation


def test_bad_actions_are_explained_cost_a_turn_and_continue(webshop_url: str) -> None:
    with EnvClient(webshop_url) as client:
        created = client.create("test/1")
        session, expert = created.session_id, created.info["expert_action"]
        bad = [
            ("click[buy now]", "not a clickable element"),
            ("buy the lotion", "cannot parse"),
            ("search[]", "search query is empty"),
        ]
        for turn, (action, why) in enumerate(bad, start=1):
            result = client.step(session, action)
            assert result.observation.startswith("Invalid action") and why in result.observation
            assert result.info["turn"] == turn and result.reward == 0.0
            assert not result.terminated and not result.truncated
            assert result.info["expert_action"] == expert  # nothing moved
        result = client.step(session, expert)
        result = client.step(session, "search[more lotion]")
        assert "no search bar on this page" in result.observation and result.info["turn"] == 5
        while "expert_action" in result.info:
            result = client.step(session, result.info["expert_action"])
        assert result.terminated and result.info["success"]
        client.delete(session)


def test_turn_limit_truncates(env: WebShopEnv) -> None:
    env.reset(task_id="test/2", options={"max_turns": 2})
    *_, terminated, truncated, _ = env.step("click[nothing]")
    assert not (terminated or truncated)
    *_, terminated, truncated, info = env.step("click[nothing]")
    assert truncated and not terminated and not info["success"]


def test_wrong_purchase_ends_the_episode_with_partial_reward(env: WebShopEnv) -> None:
    env.reset(task_id="test/4")
    goal = env.world.goal("test", 4)
    env.step(env.expert_action())
    env.step(env.expert_action())  # the target's page
    observation, reward, terminated, _, info = env.step("click[buy now]")  # no options chosen
    parts = info["reward_parts"]
    expected = (parts["matched_attributes"] + 1) / (len(goal.attributes) + len(goal.options) + 1)
    assert terminated and not info["success"] and info["lost"]
    assert reward == pytest.approx(expected) and parts["matched_options"] == 0
    assert observation.startswith("Thank you for shopping with us!") and f"{expected:.4g}" in observation


def test_compat_routes_speak_webshops_dialect(webshop_url: str) -> None:
    with httpx.Client(base_url=webshop_url) as http:
        env_idx = http.post("/create").json()
        assert isinstance(env_idx, int)
        reset = http.post("/reset", json={"env_idx": env_idx, "data_idx": 0}).json()
        assert reset["observation"].startswith("WebShop [SEP] Instruction:")
        step = http.post("/step", json={"env_idx": env_idx, "action": "search[coffee]"}).json()
        assert "Total results" in step["observation"] and step["done"] is False
        actions = http.get("/available_actions", params={"env_idx": env_idx}).json()
        assert actions["has_search_bar"] is False and actions["clickables"][0] == "back to search"
        assert http.post("/close", json={"env_idx": env_idx}).status_code == 200


# ----- the website over plain HTTP ------------------------------------------------------


def test_site_pages_and_purchase_over_http(webshop_url: str, env: WebShopEnv) -> None:
    goal = env.world.goal("test", 5)
    target = env.world.by_asin[goal.asin]
    with httpx.Client(base_url=f"{webshop_url}/site") as http:
        assert "test 5" in http.get("/").text
        assert http.get("/world.json").json()["fingerprint"] == env.world.fingerprint
        search = http.get("/test/5/")
        assert goal.instruction in search.text and 'name="q"' in search.text
        results = http.get("/test/5/search", params={"q": target.title})
        assert target.asin in results.text and 'data-page="results"' in results.text
        item = http.get(f"/test/5/item/{target.asin}")
        assert all(v in item.text for vs in target.options.values() for v in vs)
        chosen = [
            ("o", f"{f}:{v}") for f, values in target.options.items() for v in values if v in goal.options
        ]
        done = http.post("/test/5/buy", content=str(httpx.QueryParams([("asin", target.asin), *chosen])))
        assert 'data-reward="1.0"' in done.text and "Thank you for shopping with us!" in done.text
        nothing = http.post("/test/5/buy", content=f"asin={target.asin}")
        expected = purchase_reward(goal, target, {})
        assert f'data-reward="{expected.value!r}"' in nothing.text
        assert http.get("/test/5/item/NOSUCHASIN").status_code == 404
        assert http.get("/test/99999/").status_code == 404


def test_metadata_and_tasks(webshop_url: str) -> None:
    with EnvClient(webshop_url) as client:
        metadata = client.metadata()
        assert metadata.name == "webshop" and metadata.splits == {"train": 40, "test": 60, "validation": 200}
        assert "search[" in metadata.instruction and metadata.max_turns == 15
        task = client.tasks("train", limit=1).tasks[0]
        assert task.task_id == "train/0"


# ----- original WebShop data files ------------------------------------------------------

ORIGINAL_PRODUCTS = [
    {
        "asin": "B07ORIG001",
        "name": "Issey Miyake L'Eau d'Issey Eau de Toilette Spray",
        "full_description": "A fresh, floral scent.",
        "small_description": ["Long lasting fragrance", "Made in France"],
        "pricing": "$45.50 - $89.00",
        "product_category": "Beauty & Personal Care › Fragrance › Women's › Eau de Toilette",
        "category": "beauty",
        "query": "Eau de Toilette ",
        "customization_options": {
            "Size": [{"value": "3.3 Fl Oz/100 ml", "image": None}, {"value": "6.76 Fl Oz", "image": None}],
            "Color": None,
        },
        "images": ["https://example.invalid/a.jpg"],
    },
    {
        "asin": "B07ORIG002",
        "name": "Earth Mama Bright Citrus Deodorant",
        "full_description": "Natural deodorant.",
        "small_description": "Aluminum free",
        "pricing": "",
        "product_category": "Beauty & Personal Care › Personal Care › Deodorants",
        "category": "beauty",
        "query": "deodorant",
        "customization_options": {"Scent": [{"value": "Bright Citrus"}, {"value": "Lavender"}]},
        "images": [],
    },
    {"asin": "B07ORIG001", "name": "a repeated product is skipped", "customization_options": {}},
]
ORIGINAL_ATTRIBUTES = {
    "B07ORIG001": {"attributes": ["long lasting"], "instruction": "x", "instruction_attributes": []},
    "B07ORIG002": {"attributes": ["aluminum free", "natural ingredients"]},
}
ORIGINAL_HUMAN_INS = {
    "B07ORIG001": [
        {
            "asin": "B07ORIG001",
            "instruction": "i need a long lasting 6.76 fl oz bottle of l'eau d'issey.",
            "instruction_attributes": ["long lasting"],
            "instruction_options": ["6.76 fl oz"],
        },
        {
            "asin": "B07ORIG001",
            "instruction": "skipped",
            "instruction_attributes": [],
            "instruction_options": [],
        },
    ],
    "B07ORIG002": [
        {
            "asin": "B07ORIG002",
            "instruction": "i want aluminum free deodorant in bright citrus",
            "instruction_attributes": ["aluminum free"],
            "instruction_options": ["Bright Citrus"],
        }
    ],
    "B07NOTHERE": [{"instruction": "gone", "instruction_attributes": ["x"], "instruction_options": []}],
}


@pytest.fixture()
def original_files(tmp_path: Path) -> dict[str, str]:
    files = {
        "products_file": ("items_shuffle_1000.json", ORIGINAL_PRODUCTS),
        "attributes_file": ("items_ins_v2_1000.json", ORIGINAL_ATTRIBUTES),
        "instructions_file": ("items_human_ins.json", ORIGINAL_HUMAN_INS),
    }
    for name, content in files.values():
        (tmp_path / name).write_text(json.dumps(content))
    return {key: str(tmp_path / name) for key, (name, _) in files.items()}


def test_loader_normalises_original_products(original_files: dict[str, str]) -> None:
    products = load_products(original_files["products_file"], original_files["attributes_file"])
    assert [p.asin for p in products] == ["B07ORIG001", "B07ORIG002"]
    perfume, deodorant = products
    assert perfume.options == {"size": ("3.3 fl oz | 100 ml", "6.76 fl oz")}
    assert perfume.price == 45.50 and perfume.query == "eau de toilette"
    assert perfume.attributes == ("long lasting",) and perfume.bullet_points[0] == "Long lasting fragrance"
    assert deodorant.price == 100.0 and deodorant.bullet_points == ("Aluminum free",)
    assert deodorant.attributes == ("aluminum free", "natural ingredients")


def test_loader_reads_human_goals(original_files: dict[str, str]) -> None:
    products = load_products(original_files["products_file"], original_files["attributes_file"])
    goals = load_human_goals(original_files["instructions_file"], products)
    assert sorted(g.asin for g in goals) == ["B07ORIG001", "B07ORIG002"]
    perfume = next(g for g in goals if g.asin == "B07ORIG001")
    assert perfume.options == ("6.76 fl oz",) and perfume.attributes == ("long lasting",)
    assert perfume.instruction.startswith("i need a long lasting 6.76 fl oz bottle of l'eau d'issey")
    assert perfume.price_upper > 45.5


def test_env_on_original_files_plays_to_reward_one(original_files: dict[str, str], tmp_path: Path) -> None:
    env = WebShopEnv(**original_files, n_train=1, n_test=1, cache_dir=tmp_path / "cache")
    assert env.splits() == {"train": 1, "test": 1, "validation": 0}  # no human goal left for validation
    for task in env.tasks("train") + env.tasks("test"):
        env.reset(task_id=task.task_id)
        while not env.done:
            *_, info = env.step(env.expert_action())
        assert info["success"], task.task_id
