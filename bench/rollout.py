"""Rollout throughput: episodes/min and generated tokens/s of the default model on
textworld, for the same episodes played three ways:

* ``sequential``: one episode at a time (concurrency 1);
* ``free``: N episodes in flight, each awaiting its own generation (the rollout engine's
  default: the policy's continuous batcher groups whoever is waiting, nobody waits for
  a turn barrier, a finished episode's slot is refilled at once);
* ``barrier``: groups of N episodes in lock-step, as AgentGym-RL does (every turn waits
  for the group's slowest generation and env step; the next group starts when the
  whole group is done).

    python bench/rollout.py [--n 4] [--episodes 8] [--max-turns 3] [--max-new-tokens 48]
                            [--format plain] [--step-delay 0] [--step-delay 0.1:3.0] [--json out.json]
                            [--prefix-cache on,off] [--show-actions] [--policy hf,vllm]

``--policy hf,vllm`` plays the same episodes with the HF continuous batcher and with vLLM
(its CPU build here: float32, eager, vLLM's own scheduling and paged KV cache; prefix
caching as vLLM does it). Both run float32 and the same greedy sampling; the vLLM engine
starts (and warms up) before timing. Generated tokens are counted from the trajectories,
so the two columns count the same thing; rows/decode and prompt tokens are the HF
batcher's own counters (vLLM rows: 0).

Variation comes from the real episodes: tasks of four challenges with different
observations, replies of different lengths, and episodes that end early when the game
ends. The default agent format is ``plain`` with replies stopped at their first newline:
the untrained model rarely writes a ReAct ``Action:`` line, and a reply that does not
parse never reaches the env, so env latency would not matter at all. Textworld steps take
milliseconds, far below a CPU generation, so ``--step-delay LO:HI`` adds an *artificial*
env latency: the bench's env server holds each step response for a time drawn uniformly
from [LO, HI] s (an ASGI middleware added here, outside the env code and outside the
product's server config), standing in for slow engines (ScienceWorld steps take
76-240 ms, web environments seconds). Greedy decoding makes the three schedules do the
same token work. The env server runs in this process (its engine calls run in threads);
games are generated and the model warmed up before timing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import time
from dataclasses import asdict, astuple, dataclass

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.policies.base import Policy, SamplingParams
from agentgym.policies.expert import ExpertPolicy
from agentgym.policies.hf import HFPolicy
from agentgym.servers.app import ServerConfig, create_app
from agentgym.servers.launcher import serve_in_thread

MODES = {"sequential": {"concurrency": 1}, "free": {}, "barrier": {"barrier": True}}


class StepDelay:
    """ASGI middleware: holds every ``POST .../step`` for ``uniform(low, high)`` seconds."""

    def __init__(self, app: ASGIApp, low: float, high: float, seed: int = 0) -> None:
        self.app, self.low, self.high = app, low, high
        self.rng = random.Random(seed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith("/step"):
            await asyncio.sleep(self.rng.uniform(self.low, self.high))
        await self.app(scope, receive, send)


@dataclass
class Row:
    policy: str
    mode: str
    prefix_cache: str
    step_delay: str
    episodes: int
    seconds: float
    episodes_per_min: float
    tokens_per_s: float
    rows_per_decode: float
    """Mean live batch: tokens sampled per decode forward."""
    prompt_tokens: int
    """Prompt tokens the model encoded (the rest came from the prefix cache)."""
    mean_turns: float
    env_steps: int
    """Turns whose reply parsed, so the env was stepped (and the step delay paid)."""
    errored: int
    load: float
    """1-minute load average at the end: well above the cores this bench uses means
    other processes competed for the CPU and the row is not comparable."""


def parse_delay(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


def pick_tasks(url: str, count: int) -> list[str]:
    """The first ``count`` test tasks (they cycle through the four challenges)."""
    tasks = httpx.get(f"{url}/tasks", params={"split": "test", "limit": count}).json()["tasks"]
    return [task["task_id"] for task in tasks]


def run_mode(
    runner: asyncio.Runner,
    url: str,
    kind: str,
    policy: Policy,
    specs: list[EpisodeSpec],
    mode: str,
    args: argparse.Namespace,
    delay: str,
) -> Row:
    stop = ("\n",) if args.format == "plain" else ()
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens, stop=stop)
    options = {"concurrency": args.n, **MODES[mode]}
    config = RolloutConfig(
        max_turns=args.max_turns,
        sampling=sampling,
        format=args.format,
        show_actions=args.show_actions,
        **options,
    )
    stats = getattr(policy, "stats", None)  # the HF batcher's counters; vLLM keeps its own
    before = (stats.decode_steps, stats.prompt_tokens) if stats else (0, 0)
    start = time.perf_counter()
    trajectories = runner.run(run_episodes(url, policy, specs, config))
    seconds = time.perf_counter() - start
    tokens = sum(t.generated_tokens or 0 for t in trajectories)
    decodes = stats.decode_steps - before[0] if stats else 0
    return Row(
        policy=kind,
        mode=mode if mode != "free" else f"free (N={args.n})",
        prefix_cache="off" if getattr(policy, "prefix_cache", None) == 0 else "on",
        step_delay=delay,
        episodes=len(trajectories),
        seconds=round(seconds, 1),
        episodes_per_min=round(len(trajectories) / seconds * 60, 2),
        tokens_per_s=round(tokens / seconds, 1),
        rows_per_decode=round(tokens / decodes, 2) if decodes else 0.0,
        prompt_tokens=stats.prompt_tokens - before[1] if stats else 0,
        mean_turns=round(sum(t.turns for t in trajectories) / len(trajectories), 2),
        env_steps=sum(action is not None for t in trajectories for action in t.actions),
        errored=sum(t.errored for t in trajectories),
        load=round(os.getloadavg()[0], 2),
    )


COLUMNS = ("policy", "mode", "prefix cache", "step delay s", "episodes", "wall s", "episodes/min", "gen tok/s",
           "rows/decode", "prompt tok encoded", "turns", "env steps", "errors", "load")  # fmt: skip
"""Table headings, one per :class:`Row` field, in field order."""


def print_table(rows: list[Row]) -> None:
    lines = [COLUMNS, *(astuple(row) for row in rows)]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(COLUMNS))]
    for i, line in enumerate(lines):
        print("  ".join(str(cell).rjust(width) for cell, width in zip(line, widths, strict=True)), flush=True)
        if i == 0:
            print("  ".join("-" * width for width in widths))


async def start_policy(kind: str, prefix: str, n: int) -> Policy:
    """The policy under test, float32 on CPU; built inside the runner's loop (vLLM's engine
    binds to the loop it starts on)."""
    if kind == "vllm":
        from agentgym.policies.vllm import VLLMPolicy

        return VLLMPolicy("smollm2-135m", max_model_len=2048, enable_prefix_caching=prefix == "on")
    return HFPolicy(
        "smollm2-135m", device="cpu", max_batch_size=n, prefix_cache=0 if prefix == "off" else None
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=4, help="episodes in flight (free, barrier group size)")
    parser.add_argument("--episodes", type=int, default=8, help="episodes per mode")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--step-delay", action="append", help="LO:HI seconds of artificial env latency (repeatable)"
    )
    parser.add_argument("--modes", default="sequential,free,barrier")
    parser.add_argument(
        "--format",
        default="plain",
        help="agent format; plain (default) stops replies at their first newline, so the untrained model's "
        "replies parse and reach the env (in react it rarely writes an Action line)",
    )
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument(
        "--prefix-cache",
        default="on",
        help="on, off or on,off: reuse of cached prompt prefixes (compare both)",
    )
    parser.add_argument("--policy", default="hf", help="hf, vllm or hf,vllm (the same episodes with each)")
    parser.add_argument(
        "--show-actions",
        action="store_true",
        help="append the valid commands to observations (as training does)",
    )
    args = parser.parse_args()
    delays = args.step_delay or ["0"]
    rows = []
    for kind, prefix, delay in itertools.product(
        args.policy.split(","), args.prefix_cache.split(","), delays
    ):
        # One event loop per policy: a vLLM engine stays bound to the loop it started on.
        with asyncio.Runner() as runner:
            policy = runner.run(start_policy(kind, prefix, args.n))
            app = create_app(ServerConfig(env="textworld", max_sessions=max(64, args.n)))
            app.add_middleware(StepDelay, *parse_delay(delay))
            with serve_in_thread(app) as url:
                specs = [EpisodeSpec(task, 0, "test") for task in pick_tasks(url, args.episodes)]
                runner.run(run_episodes(url, ExpertPolicy(), specs))  # generates every game before timing
                warm_up = RolloutConfig(
                    max_turns=1, sampling=SamplingParams(temperature=0.0, max_new_tokens=4)
                )
                runner.run(run_episodes(url, policy, specs[:1], warm_up))  # the first calls are slow
                for mode in args.modes.split(","):
                    rows.append(run_mode(runner, url, kind, policy, specs, mode, args, delay))
                    print_table(rows[-1:])
            runner.run(policy.close())
    print()
    print_table(rows)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(row) for row in rows], handle, indent=2)


if __name__ == "__main__":  # vLLM starts its engine processes by spawn: they re-import this file
    main()
