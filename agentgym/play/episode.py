"""One episode: how episodes are played (:class:`RolloutConfig`), which one
(:class:`EpisodeSpec`), and its state and turn loop (:class:`Episode`).

:mod:`agentgym.play.rollout` runs many of these at once; an :class:`Episode` turns env, policy
and parse failures into its own ``end_reason`` and never raises them (see that module).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import zlib
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from agentgym.agents import DEFAULT_FORMAT, AgentFormat, window, with_actions
from agentgym.agents.tokens import TokenContext, oldest_version
from agentgym.clients.env_client import RetryPolicy
from agentgym.clients.openenv_client import AnyEnvClient
from agentgym.contract.errors import AgentGymError, InvalidAction
from agentgym.policies.base import Generation, GenerationRequest, Policy, SamplingParams
from agentgym.records.trajectory import Trajectory
from agentgym.wire import Metadata, StepResult

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class RolloutConfig:
    """How episodes are played. Every field has a default that works on a laptop."""

    max_turns: int | None = None
    """Agent turns per episode at most (parse failures count); ``None``: the env's ``max_turns``."""
    concurrency: int = 8
    """Episodes in flight at most (each holds one env session)."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling for every generation (a ``seed`` is varied per task, sample and turn)."""
    format: str = DEFAULT_FORMAT
    """Agent format: ``react``, ``json`` or ``plain`` (see :mod:`agentgym.agents`)."""
    show_actions: bool = False
    """Append the env's valid commands (``info["available_actions"]``) to every observation
    the policy sees; envs that report none are unaffected."""
    action_order: str = "hashed"
    """The order they are shown in (:data:`agentgym.agents.ACTION_ORDERS`)."""
    constrain_actions: bool = False
    """The policy may only reply with one of the env's valid commands (``info["available_actions"]``)
    in the agent format: token-level constrained decoding in the hf and vllm policies
    (requests carry ``info["reply_choices"]``; other policies ignore it); envs that report
    none are unaffected."""
    max_context_tokens: int | None = None
    """Token-level policies: an episode whose context plus ``sampling.max_new_tokens`` would
    pass this many tokens ends with ``end_reason = "context_full"`` before the turn
    (``None``: the policy's ``context_window``, the model's window, when it has one)."""
    history_turns: int | None = None
    """Text backends see the system prompt, the first observation and the last this many
    turns (``None``: all). Token backends always see the full incremental context."""
    env_timeout: float = 60.0
    """Seconds one env call (create, step) may take, retries included."""
    generation_timeout: float = 600.0
    """Seconds one generation may take, queueing in the policy's batcher included."""
    seed: int | None = None
    """Seed passed to every episode's env reset."""
    barrier: bool = False
    """Lock-step groups instead of free-running episodes (for comparison only)."""
    env_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=3))
    """Client retries; few, so a dead server fails its episodes within seconds."""


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to play: task, sample index (for k samples per task) and split."""

    task_id: str
    sample: int = 0
    split: str | None = None


_SERVER_GONE = ("error:env_connection", "error:env_timeout", "error:env_transport")
"""End reasons after which deleting the session would only wait on a dead server."""


class EpisodeError(Exception):
    """Ends one episode: ``kind`` becomes ``end_reason = "error:<kind>"``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def env_error_kind(exc: BaseException) -> str:
    """A short, stable name for why an env call failed."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return "env_timeout"
    if isinstance(exc, httpx.ConnectError):
        return "env_connection"
    if isinstance(exc, httpx.TransportError):
        return "env_transport"
    if isinstance(exc, AgentGymError):
        return f"env_{exc.code}"
    return "env_unknown"


@dataclass
class RunContext:
    """What all episodes of one run share."""

    client: AnyEnvClient
    policy: Policy
    agent: AgentFormat
    config: RolloutConfig
    metadata: Metadata
    max_turns: int
    system_prompt: str


class TurnBarrier:
    """Lock-step for a group of episodes: :meth:`wait` returns once every episode still
    running has called it; finished episodes :meth:`leave` the group."""

    def __init__(self, parties: int) -> None:
        self._parties = parties
        self._waiting = 0
        self._generation = 0
        self._condition = asyncio.Condition()

    async def wait(self) -> None:
        async with self._condition:
            self._waiting += 1
            generation = self._generation
            if self._waiting >= self._parties:
                self._release()
            else:
                await self._condition.wait_for(lambda: self._generation != generation)

    async def leave(self) -> None:
        async with self._condition:
            self._parties -= 1
            if self._waiting and self._waiting >= self._parties:
                self._release()

    def _release(self) -> None:
        self._waiting = 0
        self._generation += 1
        self._condition.notify_all()


class Episode:
    """One episode's state and loop. :meth:`run` never raises for env, policy or parse
    failures; it returns the trajectory with the reason the episode ended, or ``None``
    when a token budget paused it (a later :meth:`run` resumes it)."""

    def __init__(self, ctx: RunContext, spec: EpisodeSpec, barrier: TurnBarrier | None = None) -> None:
        self.ctx = ctx
        self.spec = spec
        self.barrier = barrier
        self.messages: list[dict[str, Any]] = []
        self.tokens: TokenContext | None = None
        self.session_id: str | None = None
        self.info: dict[str, Any] = {}
        self.rewards: list[float] = []
        self.actions: list[str | None] = []
        self.end_reason: str | None = None
        self.error: str | None = None
        self.invalid_turns = 0
        """Turns whose reply did not parse, whose action the env refused, or whose action is
        not among the valid commands the env listed."""
        self.timings = {"generation": 0.0, "env": 0.0, "total": 0.0}
        self._paused = False
        self._generated_now = 0
        """Tokens generated during the current :meth:`run` call."""

    @property
    def paused(self) -> bool:
        """Whether the last :meth:`run` stopped at its token budget (the session is open)."""
        return self._paused

    @property
    def oldest_version(self) -> int | None:
        """The smallest weights version among the tokens sampled so far (``None``: none
        sampled yet, or the policy does not report versions)."""
        return oldest_version(self.tokens.versions if self.tokens is not None else None)

    async def run(self, token_budget: int | None = None) -> Trajectory | None:
        """Play until the episode ends and return its trajectory (the env session is
        deleted). With ``token_budget``: once the tokens generated during this call reach
        it, stop after that whole turn, keep the session and return ``None``; the next call
        resumes. The budget is checked between turns only; a policy that returns no token
        ids never pauses."""
        if self.end_reason is not None:
            raise RuntimeError(f"episode {self.spec.task_id}#{self.spec.sample} already ended")
        if token_budget is not None and token_budget < 1:
            raise ValueError("token_budget must be at least 1")
        start = time.perf_counter()
        self._paused, self._generated_now = False, 0
        try:
            if self.session_id is None:
                await self._start()
            while self.end_reason is None:
                if token_budget is not None and self._generated_now >= token_budget:
                    self._paused = True
                    break
                await self._turn()
        except EpisodeError as exc:
            self.end_reason, self.error = f"error:{exc.kind}", str(exc) or type(exc).__name__
        except Exception as exc:  # a bug must not take the other episodes down with it
            log.exception("episode %s#%d failed", self.spec.task_id, self.spec.sample)
            self.end_reason, self.error = "error:internal", f"{type(exc).__name__}: {exc}"
        finally:
            self.timings["total"] += time.perf_counter() - start
            if not self._paused:
                if self.barrier is not None:
                    await self.barrier.leave()
                await self._close_session()
        return None if self._paused else self._trajectory()

    async def drop(self) -> None:
        """End a paused episode without a trajectory: delete its env session."""
        if not self._paused:
            raise RuntimeError(f"episode {self.spec.task_id}#{self.spec.sample} is not paused")
        self._paused, self.end_reason = False, "dropped"
        await self._close_session()

    # ----- the loop ----------------------------------------------------------------------

    async def _start(self) -> None:
        options = {"max_turns": self.ctx.max_turns}
        created = await self._env(
            self.ctx.client.create(self.spec.task_id, seed=self.ctx.config.seed, options=options)
        )
        self.session_id, self.info = created.session_id, created.info
        observation = self._shown(created.observation)
        self.messages = [
            {"role": "system", "content": self.ctx.system_prompt, "loss": False},
            {"role": "user", "content": observation, "loss": False},
        ]
        tokenizer = self.ctx.policy.tokenizer
        if tokenizer is not None:
            self.tokens = TokenContext(tokenizer, self.ctx.system_prompt, observation)

    async def _turn(self) -> None:
        if self._context_full():
            self.end_reason = "context_full"
            return
        reply, tool_call = await self._generate()
        message = {"role": "assistant", "content": reply, "loss": True}
        if tool_call is not None:  # kept, so the policy can replay the call to the API
            message["tool_call"] = tool_call
        self.messages.append(message)
        parsed = self.ctx.agent.parse(reply)
        if parsed.action is None:
            assert parsed.error is not None
            self.invalid_turns += 1
            self._observe(self.ctx.agent.feedback(parsed.error), None, 0.0)
        else:
            await self._act(parsed.action)
        if self.end_reason is None and len(self.actions) >= self.ctx.max_turns:
            self.end_reason = "truncated"

    async def _act(self, action: str) -> None:
        valid = self.info.get("available_actions")
        listed = not valid or action in valid  # an env that lists no commands takes any
        try:
            result: StepResult = await self._env(self.ctx.client.step(self.session_id, action))
        except EpisodeError as exc:
            if exc.kind != f"env_{InvalidAction.code}":
                raise
            # The env refused the command itself (too long, empty after its own cleanup):
            # the model can fix that, so it is a spent turn like a reply that did not parse.
            self.invalid_turns += 1
            self._observe(self.ctx.agent.feedback(f"the environment refused the action: {exc}"), action, 0.0)
            return
        self.invalid_turns += not listed
        self.info = result.info
        if result.terminated:
            self.end_reason = "terminated"
        elif result.truncated:
            self.end_reason = "truncated"
        self._observe(result.observation, action, result.reward)

    def _observe(self, observation: str, action: str | None, reward: float) -> None:
        self.actions.append(action)
        self.rewards.append(reward)
        observation = self._shown(observation)
        self.messages.append({"role": "user", "content": observation, "loss": False})
        if self.tokens is not None:
            self.tokens.add_observation(observation, len(self.messages))

    def _context_full(self) -> bool:
        """Whether the next reply could run past the context limit (a model past its window
        fails or silently forgets the start; the episode ends instead, with its own reason)."""
        limit = self.ctx.config.max_context_tokens or getattr(self.ctx.policy, "context_window", None)
        if self.tokens is None or limit is None:
            return False
        return len(self.tokens.ids) + self.ctx.config.sampling.max_new_tokens > limit

    def _shown(self, observation: str) -> str:
        """The observation as the policy sees it (with the valid commands when configured and
        the episode goes on)."""
        if not self.ctx.config.show_actions or self.end_reason is not None:
            return observation
        return with_actions(observation, self.info.get("available_actions"), self.ctx.config.action_order)

    # ----- calls that may fail -----------------------------------------------------------

    async def _generate(self) -> tuple[str, dict[str, str] | None]:
        """The reply text, and ``{"name", "arguments"}`` when it came as a tool call."""
        if self.barrier is not None:
            await self.barrier.wait()
        request = self._request()
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.ctx.config.generation_timeout):
                (generation,) = await self.ctx.policy.generate([request], self._sampling())
        except TimeoutError:
            raise EpisodeError(
                "generation_timeout", f"no reply within {self.ctx.config.generation_timeout}s"
            ) from None
        except Exception as exc:
            log.warning("generation failed for %s: %r", self.spec.task_id, exc)
            raise EpisodeError("generation", f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.timings["generation"] += time.perf_counter() - start
        self._generated_now += len(generation.token_ids or ())
        call = generation.tool_call
        return self._reply_text(generation), (
            {"name": call["name"], "arguments": call["arguments"]} if call else None
        )

    def _sampling(self) -> SamplingParams:
        """The run's sampling; a run-level seed becomes one seed per (task, sample, turn), so
        runs repeat exactly and the k samples of a task still differ."""
        sampling = self.ctx.config.sampling
        if sampling.seed is None:
            return sampling
        key = f"{self.spec.task_id}:{self.spec.sample}:{len(self.actions)}".encode()
        return dataclasses.replace(sampling, seed=(sampling.seed + zlib.crc32(key)) % 2**63)

    def _request(self) -> GenerationRequest:
        expert = self.info.get("expert_action")
        info: dict[str, Any] = {
            "task_id": self.spec.task_id,
            "sample": self.spec.sample,
            "turn": len(self.actions),
        }
        if isinstance(expert, str):
            # The expert policy replies with this verbatim, so hand it over in the agent's format.
            info["expert_action"] = self.ctx.agent.render(expert)
        valid = self.info.get("available_actions")
        if isinstance(valid, list):  # tool-calling policies' tools
            info["available_actions"] = valid
            if self.ctx.config.constrain_actions and valid:
                info["reply_choices"] = [self.ctx.agent.render(action) for action in valid]
        return GenerationRequest(
            messages=[
                {k: m[k] for k in ("role", "content", "tool_call") if k in m}
                for m in self._visible_messages()
            ],
            prompt_ids=list(self.tokens.ids) if self.tokens is not None else None,
            info=info,
        )

    def _visible_messages(self) -> list[dict[str, Any]]:
        if self.tokens is not None:
            return self.messages
        return window(self.messages, self.ctx.config.history_turns)

    def _reply_text(self, generation: Generation) -> str:
        if self.tokens is None:
            call = generation.tool_call
            if call is None:
                return generation.text
            # A tool call is written down in the agent's format (any content as the thought,
            # on one line), so the reply parses to exactly the called command.
            return self.ctx.agent.render(call["action"], " ".join(generation.text.split()) or None)
        if generation.token_ids is None or generation.logprobs is None:
            raise EpisodeError("generation", "a token-level policy returned no token ids or log-probs")
        self.tokens.add_generation(
            generation.token_ids, generation.logprobs, generation.versions, generation.choices
        )
        # What the model wrote is what its tokens say, never a re-tokenized string.
        return self.tokens.tokenizer.decode(generation.token_ids, skip_special_tokens=True)

    async def _env(self, call: Awaitable[T]) -> T:
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.ctx.config.env_timeout):
                return await call
        except (TimeoutError, httpx.HTTPError, AgentGymError) as exc:
            raise EpisodeError(env_error_kind(exc), str(exc) or type(exc).__name__) from exc
        finally:
            self.timings["env"] += time.perf_counter() - start

    async def _close_session(self) -> None:
        """Free the server's engine; best effort (an unreachable server frees it on TTL)."""
        if self.session_id is None or self.end_reason in _SERVER_GONE:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5.0):
                await self.ctx.client.delete(self.session_id)

    # ----- the record --------------------------------------------------------------------

    def _trajectory(self) -> Trajectory:
        tokens = self.tokens
        drift = bool(tokens and not self.end_reason.startswith("error:") and tokens.drifted(self.messages))
        return Trajectory(
            env=self.ctx.metadata.name,
            task_id=self.spec.task_id,
            policy=self.ctx.policy.name,
            messages=self.messages,
            sample=self.spec.sample,
            split=self.spec.split,
            seed=self.ctx.config.seed,
            format=self.ctx.agent.name,
            token_ids=tokens.ids if tokens else None,
            loss_mask=tokens.loss_mask if tokens else None,
            logprobs=tokens.logprobs if tokens else None,
            versions=tokens.versions if tokens else None,
            reply_choices=tokens.reply_choices if tokens and any(tokens.reply_choices) else None,
            rewards=self.rewards,
            actions=self.actions,
            score=float(self.info.get("score", 0.0)),
            success=bool(self.info.get("success", False)),
            turns=sum(m["role"] == "assistant" for m in self.messages),
            invalid_turns=self.invalid_turns,
            end_reason=self.end_reason or "truncated",
            error=self.error,
            template_drift=drift,
            generated_tokens=tokens.generated_tokens if tokens else None,
            timings={key: round(value, 4) for key, value in self.timings.items()},
        )
