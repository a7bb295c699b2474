"""The viewer page in real headless chromium (Debian's, as in test_viewer.py) and
``agentgym plot``'s curves.png: the episode header's turn count, no stray ``null`` in turns,
the count of malformed lines skipped, rate axes on 0..1, integer step axes, values on chart
hover, deep links to an episode, each phase's loss on its own axes, held-out success with
its intervals, and a line where RL starts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentgym.envs.webshop.browser import CHROMIUM, CHROMIUM_ARGS
from agentgym.records.curves import wilson_interval
from agentgym.records.trajectory import Trajectory, write_trajectories
from agentgym.servers.launcher import serve_in_thread
from agentgym.trainers.plot import plot_run
from agentgym.viewer import create_app

HELD_OUT = 0.125
OUTCOMES = {f"task-{i}": float(i == 0) for i in range(8)}  # 1 of 8: HELD_OUT
METRICS = [
    {"step": 1, "phase": "bc", "loss": 2.4},
    {"step": 2, "phase": "bc", "loss": 1.9, "eval_success_rate": HELD_OUT, "eval_outcomes": OUTCOMES},
    {"step": 3, "phase": "rl", "loss": 0.05, "success_rate": 0.25, "max_turns": 4},
    {"step": 4, "phase": "rl", "loss": -0.02, "success_rate": 0.5, "max_turns": 4, "staleness_mean": 0.5},
    {"step": 5, "phase": "rl", "loss": 0.01, "success_rate": 0.75, "max_turns": 4, "eval_success_rate": HELD_OUT},
]  # fmt: skip
"""BC then RL; held-out success flat at 0.125 (1 of 8 tasks at step 2; no outcomes at step 5);
staleness logged at one step only."""


def episode(i: int, agent_format: str) -> Trajectory:
    """A text episode of ``i % 3 + 1`` turns; plain-format replies carry no thought."""
    turns = i % 3 + 1
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Play.", "loss": False}]
    for turn in range(turns):
        reply = "go north" if agent_format == "plain" else f"Thought: turn {turn}.\nAction: go north"
        messages += [
            {"role": "user", "content": f"room {turn}", "loss": False},
            {"role": "assistant", "content": reply, "loss": True},
        ]
    messages.append({"role": "user", "content": "The end.", "loss": False})
    return Trajectory(
        env="textworld",
        task_id=f"task-{i}",
        policy="p",
        messages=messages,
        format=agent_format,
        actions=["go north"] * turns,
        rewards=[0.0] * turns,
        turns=turns,
        success=i % 2 == 0,
        end_reason="terminated",
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder: rollouts of step 3 (react), an eval file (plain), metrics."""
    root = tmp_path_factory.mktemp("run")
    write_trajectories(root / "rollouts" / "step-000003.jsonl", [episode(i, "react") for i in range(4)])
    write_trajectories(root / "eval" / "trajectories.jsonl", [episode(i, "plain") for i in range(3)])
    with (root / "eval" / "trajectories.jsonl").open("a") as malformed:  # skipped, and counted
        malformed.write(json.dumps({"task_id": "bad", "messages": "not a list"}) + "\n")
    (root / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in METRICS))
    return root


@pytest.fixture(scope="module")
def url(run: Path) -> Iterator[str]:
    with serve_in_thread(create_app(run, poll_s=60)) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed")
    with playwright_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, url: str) -> Iterator[Any]:
    opened = browser.new_page(viewport={"width": 1400, "height": 1000})
    opened.goto(url)
    opened.wait_for_selector("body[data-ready=true]")
    yield opened
    opened.close()


def open_row(page: Any, source: str, nth: int = 0) -> int:
    """Filter the list to ``source``, click its ``nth`` row, wait for the episode; its id."""
    page.select_option("select[name=source]", source)
    page.wait_for_function(
        f"[...document.querySelectorAll('#episode-list tbody tr td[title]')].every(td => td.title.endsWith('{source}'))"
    )
    row = page.locator("#episode-list tbody tr").nth(nth)
    episode_id = int(row.get_attribute("data-id"))
    row.click()
    page.wait_for_selector(f".episode[data-episode='{episode_id}'] .turn[data-turn]")
    return episode_id


# ----- episodes ---------------------------------------------------------------------------


def test_the_header_counts_episodes_and_skipped_malformed_lines(page: Any) -> None:
    assert page.inner_text("#root").endswith("· 7 episodes · 1 malformed skipped")


def test_the_episode_header_counts_turns(page: Any) -> None:
    open_row(page, "rollouts/step-000003.jsonl", nth=2)  # episode 2: 3 turns
    header = page.inner_text(".episode-head")
    assert "[object Object]" not in header
    assert " · 3 turns · terminated" in header


def test_a_turn_without_a_thought_prints_no_null(page: Any) -> None:
    open_row(page, "eval/trajectories.jsonl", nth=1)
    cards = page.locator("#detail-pane .turn[data-turn]")
    assert cards.count() == 2
    stray = cards.evaluate_all(
        "cards => cards.flatMap(c => [...c.childNodes].filter(n => n.nodeType === Node.TEXT_NODE)"
        ".map(n => n.textContent))"
    )
    assert stray == []
    assert page.locator("#detail-pane .turn .thought").count() == 0
    assert "null" not in page.inner_text("#detail-pane")


def test_a_deep_link_opens_its_episode(browser: Any, url: str, run: Path) -> None:
    page = browser.new_page()
    page.goto(f"{url}/#eval/trajectories.jsonl/2")
    page.wait_for_selector("body[data-ready=true]")
    episodes = page.locator("#detail-pane .episode")
    assert episodes.count() == 1
    header = page.inner_text(".episode-head")
    assert "task-2" in header and "eval/trajectories.jsonl" in header
    page.close()


def test_opening_an_episode_puts_its_link_in_the_url(page: Any) -> None:
    open_row(page, "rollouts/step-000003.jsonl", nth=1)
    assert page.evaluate("location.hash") == "#rollouts/step-000003.jsonl/1"
    open_row(page, "eval/trajectories.jsonl", nth=0)
    assert page.evaluate("location.hash") == "#eval/trajectories.jsonl/0"
    page.go_back()  # Back opens the episode before
    page.wait_for_function("document.querySelector('.episode-head').innerText.includes('rollouts/')")
    assert "task-1" in page.inner_text(".episode-head")


# ----- dashboard --------------------------------------------------------------------------


def chart(page: Any, panel: str) -> Any:
    page.click("button[data-tab=dashboard]")
    page.wait_for_selector("#charts .chart")
    return page.locator(f"#charts .chart[data-panel='{panel}']")


def test_a_flat_rate_is_drawn_on_a_zero_to_one_axis(page: Any) -> None:
    held_out = chart(page, "held-out success")
    assert held_out.locator("svg text.y-tick").all_text_contents() == ["1", "0"]


def test_step_axes_have_integer_ticks(page: Any) -> None:
    chart(page, "train success")
    for panel in ("train success", "loss · rl", "staleness (policy versions)"):  # staleness: one step only
        ticks = chart(page, panel).locator("svg text.x-tick").all_text_contents()
        assert ticks and all(tick.lstrip("-").isdigit() for tick in ticks), (panel, ticks)
    assert chart(page, "staleness (policy versions)").locator("svg text.x-tick").all_text_contents() == [
        "3",
        "4",
        "5",
    ]


def test_hovering_a_chart_shows_the_values_at_that_step(page: Any) -> None:
    point = chart(page, "train success").locator("circle").nth(1).bounding_box()  # step 4
    page.mouse.move(point["x"] + point["width"] / 2, point["y"] + point["height"] / 2)
    assert page.evaluate("!document.getElementById('tooltip').hidden")
    assert page.inner_text("#tooltip") == "step 4 · success_rate 0.5"
    page.mouse.move(5, 5)
    assert page.evaluate("document.getElementById('tooltip').hidden")


def test_the_loss_of_each_phase_has_its_own_chart(page: Any) -> None:
    bc, rl = chart(page, "loss · bc"), chart(page, "loss · rl")
    assert chart(page, "loss").count() == 0  # not one axis for an NLL and an RL loss
    assert bc.locator("polyline").count() == rl.locator("polyline").count() == 1
    assert bc.locator("circle").count() + rl.locator("circle").count() == len(METRICS)
    # Each on its own scale: the RL loss spans its chart's height, not a flat line under the NLL.
    heights = [max(ys) - min(ys) for ys in (_ys(bc), _ys(rl))]
    assert all(h > 50 for h in heights), heights


def test_held_out_success_has_its_intervals_and_a_line_where_rl_starts(page: Any, url: str) -> None:
    rows = httpx.get(f"{url}/api/metrics").json()["rows"]
    assert rows[1]["eval_success_rate_interval"] == pytest.approx(wilson_interval(1, 8))  # the outcomes
    assert rows[4]["eval_success_rate_interval"] == pytest.approx(wilson_interval(HELD_OUT, 1))
    assert "eval_success_rate_interval" not in rows[2]
    held_out = chart(page, "held-out success")
    bars = held_out.locator("line.interval")
    assert bars.count() == 2
    spans = [float(b.get_attribute("y1")) - float(b.get_attribute("y2")) for b in bars.all()]
    assert 0 < spans[0] < spans[1], spans  # 8 tasks: narrower than one
    assert held_out.locator("line.rl-start").count() == 1  # steps 2 and 5: RL starts at 3
    assert chart(page, "train success").locator("line.rl-start").count() == 0  # RL steps only


def _ys(panel: Any) -> list[float]:
    return [float(c.get_attribute("cy")) for c in panel.locator("circle").all()]


# ----- curves.png -------------------------------------------------------------------------


@pytest.fixture
def figure(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The figure ``agentgym plot`` saves as curves.png (kept as it is written)."""
    from matplotlib.figure import Figure

    saved: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> Any:
        saved.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    assert plot_run(run, tmp_path / "curves.png").stat().st_size > 0
    return saved[0]


def axis_of(figure: Any, title: str) -> Any:
    return next(axis for axis in figure.axes if axis.get_title() == title)


def test_curves_png_steps_are_integers(figure: Any) -> None:
    for axis in figure.axes:
        if axis.get_title():
            ticks = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), (axis.get_title(), ticks)


def test_curves_png_rates_span_zero_to_one(figure: Any) -> None:
    low, high = axis_of(figure, "train success").get_ylim()
    assert -0.1 < low <= 0 and 1 <= high < 1.1


def test_curves_png_loss_has_its_own_axes_per_phase(figure: Any) -> None:
    bc, rl = axis_of(figure, "loss · bc"), axis_of(figure, "loss · rl")
    data = [
        line for axis in (bc, rl) for line in axis.get_lines() if line.get_marker() == "o"
    ]  # not the RL marker
    assert [len(line.get_xdata()) for line in data] == [2, 3]
    assert "held-out success" in figure.get_suptitle()  # one value throughout: named, not drawn
