"""The rollout engine: many episodes at once against env servers, one trajectory each.

Every episode is its own asyncio task and awaits its own ``policy.generate`` call, so a
batching policy groups the requests of whichever episodes are waiting at that moment; an
episode whose env answers fast never waits for a slow one (no turn-level barrier).
``RolloutConfig.concurrency`` caps the episodes in flight. ``barrier=True`` instead runs
fixed groups of ``concurrency`` episodes in lock-step, as AgentGym-RL does (every turn
waits for the slowest episode of its group, the next group starts when the whole group is
done); it exists to measure the difference (``bench/rollout.py``).

Partial rollouts: :class:`Rollouts` keeps one env client open across calls, and
``Rollouts.play(specs, token_budget=n)`` pauses every episode once it has generated ``n``
tokens in that call (after a whole turn, its env session kept open); the next ``play``
resumes the paused episodes first. Between calls the policy's weights may change: the
tokens sampled before keep their log-probs and weights versions (``Trajectory.versions``),
the resumed ones are sampled by the new weights. ``run_episodes`` is ``play`` without a
budget.

Failures stay inside their episode: an env error (connection refused, 5xx, timeout, a
session gone) or a failed/timed-out generation ends that episode with
``end_reason = "error:<kind>"``; the other episodes and the run go on. A reply that does
not parse is a spent turn answered with the format's explanation (the env is not stepped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from agentgym.agents import get_format
from agentgym.clients.openenv_client import AnyEnvClient, env_client
from agentgym.play.episode import Episode, EpisodeSpec, RolloutConfig, RunContext, TurnBarrier
from agentgym.policies.base import Policy
from agentgym.records.trajectory import Trajectory
from agentgym.wire import Metadata

__all__ = ["Episode", "EpisodeSpec", "RolloutConfig", "Rollouts", "run_episodes"]


class Rollouts:
    """Free-running episodes against the env server at ``url`` over one client, across
    calls: :meth:`play` with a ``token_budget`` pauses episodes (sessions kept open) and
    the next :meth:`play` resumes them, so a trainer can update the policy's weights in
    between (partial rollouts)::

        async with Rollouts(url, policy, config) as rollouts:
            batch = await rollouts.play(specs, token_budget=256)  # the episodes that ended
            policy.update_weights(new_weights)
            batch = await rollouts.play(more_specs, token_budget=256)  # resumes the paused first

    The client's timeout and retries come from the constructor's ``config``. Leaving the
    ``async with`` deletes the sessions of the episodes still paused. A paused session
    lives on the server's idle TTL: an episode resumed after it expired ends with
    ``error:env_session_not_found``.
    """

    def __init__(
        self, url: str, policy: Policy, config: RolloutConfig | None = None, *, token: str | None = None
    ) -> None:
        self.url = url
        self.policy = policy
        self.config = config or RolloutConfig()
        _check(self.config)
        self._token = token
        self._client: AnyEnvClient | None = None
        self._metadata: Metadata | None = None
        self._paused: list[Episode] = []

    async def __aenter__(self) -> Rollouts:
        """Open the client and read ``/metadata``; raises when that fails (nothing can be
        played)."""
        client = env_client(
            self.url, token=self._token, timeout=self.config.env_timeout, retry=self.config.env_retry
        )
        try:
            self._metadata = await client.metadata()
        except BaseException:
            await client.close()
            raise
        self._client = client
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.drop(list(self._paused))
        finally:
            if self._client is not None:
                await self._client.close()
                self._client = None

    @property
    def paused(self) -> list[Episode]:
        """The paused episodes, in the order they paused."""
        return list(self._paused)

    def context(self, config: RolloutConfig) -> RunContext:
        """What the episodes started with ``config`` share."""
        if self._client is None or self._metadata is None:
            raise RuntimeError("Rollouts is not open: use `async with Rollouts(...) as rollouts`")
        return _run_context(self._client, self.policy, config, self._metadata)

    async def play(
        self,
        specs: Iterable[EpisodeSpec],
        *,
        config: RolloutConfig | None = None,
        token_budget: int | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Resume every paused episode (each keeps the config and ``max_turns`` it started
        with), then start ``specs`` with ``config`` (default: the constructor's), all under
        the cap ``config.concurrency``. Returns the trajectories of the episodes that ended
        during this call, in completion order, calling ``on_episode`` as each ends; the
        episodes that reached ``token_budget`` (tokens generated in this call) stay in
        :attr:`paused`."""
        config = config or self.config
        _check(config)
        if config.barrier:
            raise ValueError("Rollouts plays free-running episodes; lock-step runs go through run_episodes")
        if token_budget is not None and token_budget < 1:
            raise ValueError("token_budget must be at least 1")
        ctx = self.context(config)
        episodes, self._paused = self._paused, []
        episodes += [Episode(ctx, spec) for spec in specs]
        slots = asyncio.Semaphore(config.concurrency)
        done: list[Trajectory] = []

        async def play(episode: Episode) -> None:
            async with slots:
                trajectory = await episode.run(token_budget)
            if trajectory is None:
                self._paused.append(episode)
                return
            done.append(trajectory)
            if on_episode is not None:
                on_episode(trajectory)

        await asyncio.gather(*(play(episode) for episode in episodes))
        return done

    async def drop(self, episodes: Iterable[Episode]) -> None:
        """End these paused episodes without a trajectory: delete their env sessions (best
        effort) and forget them."""
        episodes = list(episodes)
        unknown = [e for e in episodes if not any(e is p for p in self._paused)]
        if unknown:
            raise ValueError(
                f"not paused here: {', '.join(f'{e.spec.task_id}#{e.spec.sample}' for e in unknown)}"
            )
        self._paused = [p for p in self._paused if not any(p is e for e in episodes)]
        await asyncio.gather(*(episode.drop() for episode in episodes))


def _check(config: RolloutConfig) -> None:
    if config.concurrency < 1:
        raise ValueError("concurrency must be at least 1")


def _run_context(
    client: AnyEnvClient, policy: Policy, config: RolloutConfig, metadata: Metadata
) -> RunContext:
    agent = get_format(config.format)
    max_turns = config.max_turns or metadata.max_turns
    return RunContext(
        client, policy, agent, config, metadata, max_turns, agent.system_prompt(metadata.instruction)
    )


async def run_episodes(
    url: str,
    policy: Policy,
    specs: Iterable[EpisodeSpec],
    config: RolloutConfig | None = None,
    *,
    token: str | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Play every episode in ``specs`` against the env server at ``url``; return their
    trajectories in completion order, calling ``on_episode`` as each one finishes.

    Raises only when the server cannot be used at all (its ``/metadata`` fails) or the
    config is invalid; everything that goes wrong inside an episode ends that episode.
    """
    config = config or RolloutConfig()
    get_format(config.format)  # an unknown format fails before connecting
    async with Rollouts(url, policy, config, token=token) as rollouts:
        if config.barrier:
            return await _run_in_lockstep(rollouts.context(config), list(specs), on_episode)
        return await rollouts.play(specs, on_episode=on_episode)


async def _run_in_lockstep(
    ctx: RunContext, specs: list[EpisodeSpec], on_episode: Callable[[Trajectory], None] | None
) -> list[Trajectory]:
    done: list[Trajectory] = []
    size = ctx.config.concurrency
    for start in range(0, len(specs), size):
        group = specs[start : start + size]
        barrier = TurnBarrier(len(group))
        for trajectory in await asyncio.gather(*(Episode(ctx, spec, barrier).run() for spec in group)):
            assert trajectory is not None  # no token budget: every episode ends
            done.append(trajectory)
            if on_episode is not None:
                on_episode(trajectory)
    return done
