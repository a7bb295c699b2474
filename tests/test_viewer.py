"""``agentgym view``: the JSON API on realistic trajectory files, and the page end to end in
real headless chromium (Debian's, as for the webshop browser mode; no ``playwright install``)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from agentgym.cli import app as cli_app
from agentgym.envs.webshop.browser import CHROMIUM, CHROMIUM_ARGS
from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.policies.expert import ExpertPolicy
from agentgym.records.trajectory import read_jsonl, write_trajectories
from agentgym.servers.launcher import serve_in_thread
from agentgym.viewer import create_app


def _load_bench() -> ModuleType:
    """bench/viewer.py makes the data (bench/ is not a package; loaded under its own name so
    its siblings never shadow real modules on sys.path)."""
    spec = importlib.util.spec_from_file_location(
        "bench_viewer", Path(__file__).parents[1] / "bench/viewer.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load_bench()
WordDecoder, synthetic_episode, write_episodes = (
    bench.WordDecoder,
    bench.synthetic_episode,
    bench.write_episodes,
)

METRICS = [
    {"step": 1, "phase": "rl", "max_turns": 2, "success_rate": 0.25, "reward_mean": 0.3, "clip_low": 0.8,
     "clip_high": 1.2, "positive_share": 0.4, "entropy": 1.9, "generated_tokens": 900, "rollout_s": 3.0},
    {"step": 2, "phase": "rl", "max_turns": 4, "success_rate": 0.5, "reward_mean": 0.55, "clip_low": 0.75,
     "clip_high": 1.3, "positive_share": 0.5, "entropy": 1.7, "generated_tokens": 1200, "rollout_s": 3.0},
]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, WordDecoder]:
    """A run folder as the trainer leaves it: config, metrics and two steps of rollouts."""
    root = tmp_path_factory.mktemp("run")
    tokens = WordDecoder()
    (root / "config.yaml").write_text("model: smollm2-135m\nalgo: bapo\n")
    for step in (1, 2):
        episodes = [synthetic_episode(i, tokens) for i in range(60 * (step - 1), 60 * step)]
        write_trajectories(root / "rollouts" / f"step-{step:06d}.jsonl", episodes)
    (root / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in METRICS))
    return root, tokens


@pytest.fixture
def client(run_dir: tuple[Path, WordDecoder]) -> Iterator[TestClient]:
    with TestClient(create_app(run_dir[0], decoder=run_dir[1])) as test_client:
        yield test_client


def records(root: Path) -> list[dict]:
    return [r for step in (1, 2) for r in read_jsonl(root / "rollouts" / f"step-{step:06d}.jsonl")]


def test_paging_and_filters(client: TestClient, run_dir: tuple[Path, WordDecoder]) -> None:
    everything = records(run_dir[0])
    first = client.get("/api/episodes?limit=25").json()
    assert first["total"] == 120 and len(first["episodes"]) == 25
    last = client.get("/api/episodes?offset=100&limit=25").json()["episodes"]
    assert [e["id"] for e in last] == list(range(100, 120))
    failed = client.get("/api/episodes?success=false&step=2&limit=500").json()
    assert failed["total"] == sum(not r["success"] for r in everything[60:])
    assert all(not e["success"] and e["step"] == 2 for e in failed["episodes"])
    rich = client.get("/api/episodes?min_reward=1&task=level3&limit=500").json()["episodes"]
    assert rich and all(e["reward"] >= 1 and "level3" in e["task_id"] for e in rich)
    info = client.get("/api/info").json()
    assert info["steps"] == [1, 2] and info["envs"] == ["textworld"] and info["has_metrics"]


@pytest.mark.parametrize(
    "query", ["success=maybe", "min_reward=lots", "step=two", "offset=-1", "limit=0", "limit=100000"]
)
def test_bad_filter_is_400(client: TestClient, query: str) -> None:
    response = client.get(f"/api/episodes?{query}")
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_request"


def test_unknown_episode_is_404(client: TestClient) -> None:
    assert client.get("/api/episodes/999").status_code == 404
    assert client.get("/api/compare?a=0&b=999").status_code == 404
    assert client.get("/api/episodes/x").status_code == 400


def test_episode_turns_and_tokens_match_the_record(
    client: TestClient, run_dir: tuple[Path, WordDecoder]
) -> None:
    record = records(run_dir[0])[7]
    episode = client.get("/api/episodes/7").json()
    assert [t["action"] for t in episode["turns"]] == record["actions"]
    assert [t["reward"] for t in episode["turns"]] == record["rewards"]
    replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    assert [t["reply"] for t in episode["turns"]] == replies
    assert all(t["thought"] and t["thought"].startswith("step") for t in episode["turns"])
    trained = [lp for lp, m in zip(record["logprobs"], record["loss_mask"], strict=True) if m]
    assert [tok["logprob"] for t in episode["turns"] for tok in t["tokens"]] == trained
    flat = [tok for run in episode["token_runs"] for tok in run["tokens"]]
    assert [tok["id"] for tok in flat] == record["token_ids"]
    pair = client.get("/api/compare?a=7&b=67").json()
    assert pair["a"]["id"] == 7 and pair["b"]["id"] == 67


def test_metrics_since(client: TestClient) -> None:
    assert client.get("/api/metrics").json() == {"rows": METRICS, "next": 2}
    assert client.get("/api/metrics?since=1").json() == {"rows": METRICS[1:], "next": 2}


def test_real_rollout_records_without_tokenizer(tmp_path: Path, choice_url: str) -> None:
    """Records from the rollout engine itself (expert on ``choice``) show turn by turn; with
    no tokenizer on the machine, token text is absent and nothing fails."""
    specs = [EpisodeSpec(f"choice/test/{i}", 0, "test") for i in range(3)]
    played = asyncio.run(run_episodes(choice_url, ExpertPolicy(), specs, RolloutConfig()))
    write_trajectories(tmp_path / "expert.jsonl", played)
    with TestClient(create_app(tmp_path / "expert.jsonl")) as test_client:
        assert test_client.get("/api/episodes?success=true").json()["total"] == 3
        episode = test_client.get("/api/episodes/0").json()
    record = next(read_jsonl(tmp_path / "expert.jsonl"))
    assert [t["action"] for t in episode["turns"]] == record["actions"]
    assert episode["turns"][0]["observation"] == record["messages"][1]["content"]
    assert episode["token_runs"] == [] and episode["tokenizer"] is None


def test_two_thousand_episodes_page(tmp_path: Path) -> None:
    """Filtering and paging over a large file (bench/viewer.py measures how fast)."""
    path = tmp_path / "big.jsonl"
    decoder = write_episodes(path, 2000)
    app = create_app(path, decoder=decoder)
    with TestClient(app) as test_client:
        page = test_client.get("/api/episodes?success=false&offset=500&limit=50").json()
        assert len(page["episodes"]) == 50 and page["total"] > 550
        assert test_client.get("/api/episodes/1999").status_code == 200


def test_cli_rejects_missing_and_foreign_files(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli_app, ["view", str(tmp_path / "nope.jsonl"), "--no-open"]).exit_code == 2
    foreign = tmp_path / "metrics.jsonl"
    foreign.write_text('{"step": 1}\n')
    assert runner.invoke(cli_app, ["view", str(foreign), "--no-open"]).exit_code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert runner.invoke(cli_app, ["view", str(empty), "--no-open"]).exit_code == 2


# ----- the page in real chromium ------------------------------------------------------


@pytest.fixture
def page_url(run_dir: tuple[Path, WordDecoder], tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The viewer on a copy of the run (the test appends to its metrics), polling every 0.5 s."""
    import shutil

    root = tmp_path / "run"
    shutil.copytree(run_dir[0], root)
    with serve_in_thread(create_app(root, decoder=run_dir[1], poll_s=0.5)) as url:
        yield url, root


def test_page_end_to_end(page_url: tuple[str, Path], tmp_path: Path) -> None:
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed")
    url, root = page_url
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("body[data-ready=true]")
        check_failed_episode(page, root)
        check_compare(page)
        page.screenshot(path=str(tmp_path / "viewer.png"), full_page=True)
        check_dashboard(page, root)
        browser.close()
    assert (tmp_path / "viewer.png").stat().st_size > 10_000


def check_failed_episode(page: object, root: Path) -> None:
    """Filter to failed episodes, open the first, compare its turns with the JSONL, hover a token."""
    page.select_option("select[name=success]", "false")
    page.wait_for_function("document.querySelector('#page-info').textContent.includes('of')")
    page.wait_for_function(
        "[...document.querySelectorAll('#episode-list .fail')].length === "
        "document.querySelectorAll('#episode-list tbody tr').length"
    )
    row = page.locator("#episode-list tbody tr").first
    episode_id = int(row.get_attribute("data-id"))
    record = records(root)[episode_id]
    assert not record["success"]
    row.click()
    page.wait_for_selector(f".episode[data-episode='{episode_id}'] .turn[data-turn]")
    turns = page.locator("#detail-pane .turn[data-turn]")
    assert turns.count() == len(record["actions"])
    observations = [m["content"] for m in record["messages"][1:-1] if m["role"] == "user"]
    for i, action in enumerate(record["actions"]):
        assert turns.nth(i).locator(".action").inner_text().endswith(action)
        assert turns.nth(i).locator(".observation").inner_text() == observations[i]
    token = turns.first.locator(".tok.trained").first
    token.hover()
    logprob = record["logprobs"][record["loss_mask"].index(1)]
    page.wait_for_selector("#tooltip:not([hidden])")
    assert f"log-prob {logprob:.4f}" in page.inner_text("#tooltip")


def check_compare(page: object) -> None:
    """Pick another episode of the same task (the other step's sample) and see both side by side."""
    page.wait_for_function("document.querySelectorAll('#compare-with option').length > 1")
    other = page.locator("#compare-with option").nth(1).get_attribute("value")
    page.select_option("#compare-with", other)
    page.wait_for_selector(".compare .episode >> nth=1")
    assert page.locator(".compare .episode").count() == 2


def check_dashboard(page: object, root: Path) -> None:
    """Curves from metrics.jsonl, and a point more once the trainer appends a step."""
    page.click("button[data-tab=dashboard]")
    panel = "#charts .chart[data-panel='train success'] circle"
    page.wait_for_function(f'document.querySelectorAll("{panel}").length === 2')
    assert page.locator("#charts .chart[data-panel='BAPO bounds'] polyline").count() == 2
    assert page.locator("#charts .chart[data-panel='tokens/s (rollout)'] circle").count() == 2
    with open(root / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({**METRICS[-1], "step": 3, "success_rate": 0.75}) + "\n")
    page.wait_for_function(f'document.querySelectorAll("{panel}").length === 3', timeout=10_000)
