"""Agent formats: strict parsing, the explanation for a bad reply, rendering, the history window."""

from __future__ import annotations

import json

import pytest

from agentgym.agents import FORMATS, get_format, window
from agentgym.agents.formats import JsonCallFormat, PlainFormat, ReActFormat

react, json_call, plain = ReActFormat(), JsonCallFormat(), PlainFormat()


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("Thought: the coin is here.\nAction: take coin", "take coin"),
        ("Action: go north", "go north"),
        ("Thought: x\n\nAction:\ngo east\n", "go east"),  # AgentGym's layout: the command on the next line
        ("Thought: x\nAction: `open door`\nObservation: the door opens", "open door"),
        ("  Action :  look  ", "look"),
    ],
)
def test_react_parses_the_action(reply: str, action: str) -> None:
    assert react.parse(reply).action == action


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("I would like to take the coin.", "no line starting with 'Action:'"),
        ("Action: go north\nAction: go south", "2 lines starting with 'Action:'"),
        ("Thought: hmm\nAction:", "the action is empty"),
        ("", "no line starting with 'Action:'"),
        ("Thought: the action: take coin", "no line starting with 'Action:'"),
    ],
)
def test_react_rejects_with_a_reason(reply: str, why: str) -> None:
    parsed = react.parse(reply)
    assert parsed.action is None and why in parsed.error


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ('{"thought": "t", "action": "take coin"}', "take coin"),
        ('{"action": "go north"}', "go north"),
        ('```json\n{"action": "look"}\n```', "look"),
        ('{"name": "act", "arguments": {"action": "open box"}}', "open box"),
        ('{"name": "act", "arguments": "{\\"action\\": \\"eat apple\\"}"}', "eat apple"),
    ],
)
def test_json_parses_the_action(reply: str, action: str) -> None:
    assert json_call.parse(reply).action == action


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("take coin", "not valid JSON"),
        ('{"action": "go"} trailing', "not valid JSON"),
        ('["go north"]', "a JSON list, not an object"),
        ('{"command": "go north"}', 'no string field "action"'),
        ('{"action": 3}', 'no string field "action"'),
        ('{"action": "  "}', "the action is empty"),
        ('{"name": "move", "arguments": {"action": "go"}}', "unknown function 'move'"),
        ('{"name": "act", "arguments": "nope"}', "not valid JSON"),
        ('{"name": "act"}', '"arguments"'),
    ],
)
def test_json_rejects_with_a_reason(reply: str, why: str) -> None:
    parsed = json_call.parse(reply)
    assert parsed.action is None and why in parsed.error


def test_plain_takes_one_line_only() -> None:
    assert plain.parse("  go north \n").action == "go north"
    assert plain.parse('"take coin"').action == "take coin"
    assert "2 lines" in plain.parse("go north\ngo south").error
    assert plain.parse("   ").error == "the action is empty"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_render_parses_back(name: str) -> None:
    agent = get_format(name)
    for action in ("take coin", "put apple on table", 'say "hi"'):
        assert agent.parse(agent.render(action)).action == action
        assert agent.parse(agent.render(action, thought="I see it.")).action == action


def test_json_render_is_json() -> None:
    assert json.loads(json_call.render("look", "why not")) == {"thought": "why not", "action": "look"}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_system_prompt_and_feedback_state_the_rules(name: str) -> None:
    agent = get_format(name)
    prompt = agent.system_prompt("Play the game.\n")
    assert prompt.startswith("Play the game.\n\n") and prompt.endswith(agent.rules())
    error = agent.parse("\n\n").error
    feedback = agent.feedback(error)
    assert f"Invalid reply: {error}." in feedback and feedback.endswith(agent.rules())
    assert "Nothing was sent to the environment" in feedback


def test_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="react"):
        get_format("xml")


def test_window_keeps_system_first_observation_and_last_turns() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "o0"}]
    for turn in range(1, 5):
        messages += [{"role": "assistant", "content": f"a{turn}"}, {"role": "user", "content": f"o{turn}"}]
    contents = lambda ms: [m["content"] for m in ms]  # noqa: E731
    assert contents(window(messages, None)) == contents(messages)
    assert contents(window(messages, 2)) == ["s", "o0", "a3", "o3", "a4", "o4"]
    assert contents(window(messages, 0)) == ["s", "o0"]
    assert contents(window(messages, 10)) == contents(messages)
    assert contents(window(messages[:4], 3)) == ["s", "o0", "a1", "o1"]
