"""``TrainConfig``: every knob of ``agentgym train``, one documented field each.

A run's config comes from the defaults, then a YAML file (``--config``), then CLI
overrides (``--set key=value``); the resolved config is saved as ``config.yaml`` in the run
folder and reloaded by ``--resume``.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentgym.contract.errors import did_you_mean
from agentgym.policies.adapters import LORA_DEFAULTS
from agentgym.policies.dtypes import AUTO
from agentgym.trainers.config_checks import config_problems
from agentgym.trainers.loss_settings import BapoConfig, ClipConfig
from agentgym.trainers.presets import PRESETS
from agentgym.trainers.schedules import schedule_of

FALLBACKS: dict[str, Any] = {
    "dual_clip": 0.0,
    "dynamic_sampling": False,
    "loss_aggregation": "token-mean",
    "kl_coef": 0.0,
    "clip.eps_high": 0.2,
}
"""Values of the algorithm-dependent fields when the preset does not set them."""


FREE_FORM_FIELDS = ("env_settings",)
"""Dict fields whose keys are not the config's (``env_settings.n_train=4`` is the env's key)."""


def unknown_keys_message(unknown: list[str]) -> str:
    """The error for ``--set`` / config-file keys that are no field: the nearest valid keys,
    then all of them."""
    hint = did_you_mean(unknown, TrainConfig.keys())
    return (
        f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}{hint}. "
        "`agentgym train --print-config` lists every key with its value and doc"
    )


def _number_kind(f: dataclasses.Field) -> type | None:
    """``int`` or ``float`` for numeric fields (optional ones included), else None."""
    default = f.default if f.default is not dataclasses.MISSING else None
    if isinstance(default, int | float) and not isinstance(default, bool):
        return float if isinstance(default, float) else int
    # Annotations are strings here (``from __future__ import annotations``).
    return {"int | None": int, "float | None": float}.get(str(f.type))


def _coerce_numbers(config: Any, prefix: str = "") -> Any:
    """YAML 1.1 reads ``1e-3`` as a string: numeric fields take numeric strings, and
    anything else that is not a number is a clear error, not a crash mid-run."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        kind = _number_kind(f)
        if value is None or isinstance(value, bool) or kind is None:
            continue
        try:
            object.__setattr__(config, f.name, kind(value))  # sections are frozen
        except (TypeError, ValueError):
            raise ValueError(f"{prefix}{f.name} must be a number, got {value!r}") from None
    return config


def _section(name: str, settings: type, values: dict[str, Any]) -> Any:
    """Section ``name`` (a ``settings`` dataclass) from a YAML mapping."""
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(settings)})
    if unknown:
        raise ValueError(unknown_keys_message([f"{name}.{key}" for key in unknown]))
    return _coerce_numbers(settings(**values), f"{name}.")


def regime_sections() -> dict[str, type]:
    """Each training regime's own settings class by its key in the config, found through the
    presets that name it (``Preset.settings``): ``agentevol``, ``critique_rl``."""
    classes = {pkgutil.resolve_name(preset.settings) for preset in PRESETS.values() if preset.settings}
    return {settings.SECTION: settings for settings in sorted(classes, key=lambda c: c.SECTION)}


def _with_regime_sections(cls: type) -> type:
    """``cls`` with a field per regime section, added before ``@dataclass`` reads the fields
    (their docs: the settings classes' docstrings)."""
    for name, settings in regime_sections().items():
        cls.__annotations__[name] = settings
        setattr(cls, name, field(default_factory=settings))
    return cls


@dataclass
@_with_regime_sections
class TrainConfig:
    # ----- what to train, where -------------------------------------------------------
    algo: str = "bapo"
    """A preset (``trainers/presets.py``; ``agentgym train --help`` lists them). It sets the
    fields below that default to None ("the algorithm's") to its paper's values; values you
    give win."""
    env: str = "textworld"
    """Registered environment name."""
    env_url: str | None = None
    """A running env server; ``None`` starts a local one for ``env`` and stops it at the end."""
    env_settings: dict[str, Any] = field(default_factory=dict)
    """Settings for the local server (``agentgym serve ENV --set``)."""
    model: str = "smollm2-135m"
    """Model alias, Hugging Face id or local folder."""
    output_dir: str = ""
    """Run folder (default ``runs/<algo>-<env>-<time>``): config, metrics, checkpoints, plot."""
    seed: int = 0
    """Seeds task sampling, generation and initialisation."""

    # ----- parameters trained -----------------------------------------------------------
    lora: bool = LORA_DEFAULTS.lora
    """Train LoRA adapters (peft) instead of all weights."""
    lora_rank: int = LORA_DEFAULTS.lora_rank
    """LoRA rank r."""
    lora_alpha: int = LORA_DEFAULTS.lora_alpha
    """LoRA scaling α (the update is scaled by α/r)."""
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_DEFAULTS.lora_targets))
    """Module names that get adapters."""
    lora_layers: int | None = LORA_DEFAULTS.lora_layers
    """Adapt only the top this many transformer layers (None: all). Backward then stops
    there, about halving a CPU update of SmolLM2 (30 layers) at little cost in quality."""
    dtype: str = AUTO
    """The model's weights and compute: ``auto`` (bf16 on a CUDA device that supports it,
    float32 elsewhere: :mod:`agentgym.policies.dtypes`), ``bfloat16``, ``float16`` or
    ``float32``. The run records it; its checkpoints play and export in it."""
    generator: str = "hf"
    """Who samples the rollouts. ``hf``: the model being trained, in-process (no weight
    transfer). ``vllm``: a vLLM engine on the GPU (the ``vllm`` extra). ``ray``: Ray actors,
    here or on other nodes (the ``ray`` extra). The last two receive the updated weights
    (LoRA merged) before they next sample."""
    vllm_gpu_memory_utilization: float = 0.3
    """``generator: vllm``: GPU memory share of the engine (the trainer needs the rest)."""
    ray_workers: int = 2
    """``generator: ray``: rollout worker actors, one CPU each, each with its own model copy."""
    ray_address: str | None = None
    """``generator: ray``: a Ray cluster to join (``ray start --head``); None starts a local Ray."""

    # ----- rollouts ------------------------------------------------------------------
    steps: int = 6
    """RL steps (each: collect a batch of groups, then update)."""
    tasks_per_step: int = 2
    """Tasks (groups) sampled from the train split per step."""
    curriculum: str = "fits-horizon"
    """Which train tasks RL draws: ``all``; ``fits-horizon``: those the expert finished
    within the step's horizon in the behaviour-cloning demonstrations (all tasks without
    behaviour cloning, or when none fits); ``unsolved``: of those, the ones the policy
    loses in a greedy play at the start of RL (one pass over the train tasks). A task no
    episode can finish within the horizon gives every episode reward 0, and a task the
    cloned policy always wins gives every episode reward 1: groups that teach nothing."""
    group_size: int = 8
    """Rollouts per task; advantages compare episodes within a group (8: a cloned policy
    that wins most tasks still gives some groups a loss to learn from)."""
    concurrency: int = 16
    """Episodes in flight at once."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts (behaviour log-probs are taken at it)."""
    max_new_tokens: int = 48
    """Tokens per agent turn at most."""
    agent_format: str = "react"
    """How the agent writes actions: react | json | plain (the command alone)."""
    max_context_tokens: int | None = None
    """An episode whose context plus ``max_new_tokens`` would pass this ends before the turn
    (``end_reason: context_full``); None: the model's window."""
    show_actions: bool = True
    """Append the env's valid commands to each observation (demonstrations, rollouts and
    evaluation alike); envs that report none are unaffected."""
    action_order: str = "hashed"
    """Their order: ``hashed`` (fixed per state, meaningless; the default since a cloned model
    learned positions in the env's alphabetical order) or ``listed`` (the env's order)."""
    constrain_actions: bool | None = None
    """Sample only replies that play one of the env's valid commands (constrained decoding,
    rollouts and evaluation alike): no turn is spent on an invalid command, and RL steps
    get ~2x cheaper (textworld, bench/RESULTS.md). This is action masking: behaviour
    log-probs, and the learner's log-probs, ratios and entropy, are those of the model's
    distribution renormalised over the allowed tokens (each trajectory records its turns'
    choices). Every generator constrains (hf's batcher, Ray's workers, vLLM's engine through
    a logits processor). None (earlier versions' default, in their run folders): on."""

    # ----- off-policy and asynchronous training ------------------------------------------
    mode: str = "sync"
    """``sync``: collect step t's rollouts, then update on them (on-policy). ``async``: step
    t+1's rollouts are generated while step t updates (one-step-off: the data is one policy
    version stale, the generator never idles during updates)."""
    max_staleness: int = 1
    """Policy versions a sampled token may lag the policy it trains (a version per training
    step). Replayed samples and paused episodes older than this are dropped; async needs ≥ 1."""
    replay_ratio: float = 0.0
    """Share of each update's episodes replayed from past steps (0: none, on-policy)."""
    replay_capacity: int = 256
    """Trained episodes the replay buffer keeps at most (the oldest go first)."""
    partial_rollout_tokens: int | None = None
    """Partial rollouts: tokens an episode may generate per step; past it the episode pauses
    after its current turn, keeps its env session and resumes in the next step under the
    newer policy (its earlier tokens keep their log-probs). Its group trains once all its
    episodes ended. None: every episode ends within its step."""

    # ----- horizon schedule ----------------------------------------------------------
    schedule: str = "scaling-inter"
    """A name in ``schedules.SCHEDULES``: fixed | scaling-inter (ScalingInter-RL)."""
    max_turns: int = 10
    """Fixed schedule: turn limit at every step."""
    rounds: list[int] = field(default_factory=lambda: [4, 6])
    """ScalingInter-RL: turn limits in order (the paper: [10, 20, 30] for TextCraft)."""
    interval: int = 3
    """ScalingInter-RL: steps per round, Δ (the paper: 100)."""

    # ----- optimisation ----------------------------------------------------------------
    learning_rate: float = 1e-3
    """AdamW learning rate (LoRA on SmolLM2: 1e-4 left the 25-step warm start narrating; 1e-3 learned the format)."""
    rl_learning_rate: float | None = 5e-4
    """Learning rate of the clipped-RL steps (not AgentEvol's or Critique-RL's); None:
    ``learning_rate``. Behaviour cloning needs a large one to learn the format fast; RL on
    the cloned policy a smaller one, so that a few noisy groups do not undo what cloning
    taught."""
    rl_optimizer: str = "fresh"
    """The optimizer state the RL phase starts with after behaviour cloning. ``fresh``: a new
    AdamW state, so RL's first updates are RL's alone. ``carried``: cloning's state goes on
    (earlier versions): with β1 = 0.9 its momentum adds cloning-sized steps to RL's first
    updates and its second moments scale RL's gradients by cloning's."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    ppo_epochs: int = 1
    """Passes over each collected batch (each pass is an update per minibatch)."""
    minibatch_size: int = 16
    """Episodes per optimizer step."""
    micro_batch_size: int = 4
    """Episodes per forward/backward; gradients accumulate up to ``minibatch_size``."""
    pack_tokens: int | None = None
    """Pack episodes end to end into rows of at most this many tokens, one row a
    forward/backward (attention kept within each episode), instead of ``micro_batch_size``
    padded rows. None: no packing."""
    advantage: str | None = None
    """Advantage estimator (``ADVANTAGE_ESTIMATORS``). None: the algorithm's."""
    clip_rule: str | None = None
    """Ratio bounds of the clipped loss: ``fixed`` (from ``clip``) or ``bapo`` (searched).
    None: the algorithm's. Independent of ``advantage``: BAPO clipping composes with any."""
    loss_aggregation: str | None = None
    """token-mean (every agent token of the minibatch weighs the same; DAPO) | seq-mean
    (every episode weighs the same) | seq-sum-norm (Dr. GRPO: token sums over the constant
    ``loss_norm_tokens``). None: the algorithm's (dr-grpo: seq-sum-norm, else token-mean)."""
    loss_norm_tokens: int | None = None
    """seq-sum-norm's constant; None: ``max_new_tokens`` x the largest horizon."""
    clip: ClipConfig = field(default_factory=ClipConfig)
    """PPO / clip-higher ratio bounds."""
    dual_clip: float | None = None
    """Dual-clip c: a token with A<0 loses at most c·|A|; 0 is off. None: the algorithm's
    (bapo 3.0, the authors' code; else off)."""
    bapo: BapoConfig = field(default_factory=BapoConfig)
    """BAPO's bound search."""
    kl_coef: float | None = None
    """Weight of the k3 KL to the reference policy, the policy at the start of RL (after the
    behaviour-cloning warm start); 0 disables it. None: the algorithm's (critique-rl 0.01, else 0)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    forced_end_coef: float = 1.0
    """Weight of the log-likelihood, under the model's own unmasked distribution, of a
    constrained reply's forced last token (the end token after a complete command, the only
    one allowed there). Its masked log-prob is 0, so RL never trains it, and the model would
    forget to end a reply outside the constrained decoder (exported, served). Counted on the
    episodes with a non-zero advantage, under every algorithm (a KL term that keeps the
    others in the update does not add it there). 1.0 chosen on validation over 0.1 (6 seeds:
    exported replies that end 93.0% against 84.8%, success not lower; docs/results.md). On
    a model that has not learned to stop (no cloning) the term is larger (-log p(end) near
    4.6 a reply) and competes with the RL gradient; lower it if such a run does not learn.
    0: off; free text has none."""
    command_mass_coef: float = 0.0
    """Weight of the log of the probability the model's own, unmasked distribution gives the
    ids the constrained decoder allowed, at every other constrained token of a reply (those
    that begin or continue one of the turn's commands). The clipped surrogate is over the
    renormalised, masked distribution, so it never trains the mass outside the allowed ids:
    RL can let it grow, and the exported model, free of the decoder, then leaves the command
    the agent would choose. Counted on the same episodes as ``forced_end_coef``. 0: off;
    at 1.0 on the default run (3 seeds) the exported replies followed the agent's choice in
    73% of validation turns against 19% and stopped more (94.5% against 84.3%), but
    validation success fell 9.4 points (docs/results.md), so it is off by default."""
    dynamic_sampling: bool | None = None
    """Drop groups whose rewards are all equal and play new groups in their place, up to
    ``max_refills`` rounds per step (DAPO). None: the algorithm's (dapo: on, else off)."""
    max_refills: int = 3
    """Dynamic sampling: extra rounds of groups per step at most, to refill the batch."""
    shuffle_advantages: bool = False
    """A placebo: each step's advantages permuted across its episodes before the update (the
    same values, handed out at random), so the run makes updates of the same size and shape
    with none of the reward's information. RL minus placebo says whether the reward signal,
    not the updates themselves, moves the model (``bench/learning.py``'s ``placebo`` arm)."""

    # ----- the behaviour-cloning warm start (and AgentEvol's first stage) ----------------
    bc_steps: int = 16
    """Behaviour-cloning steps on expert trajectories before RL (0: none)."""
    bc_batch_size: int = 4
    """Expert episodes per behaviour-cloning step."""
    bc_episodes: int = 32
    """Expert episodes collected from the train split for behaviour cloning."""
    bc_max_tokens: int = 1024
    """Demonstrations longer than this are not cloned (a CPU pays per token; short ones teach
    the format); with ``curriculum: fits-horizon`` RL still draws their tasks."""
    bc_teacher_epsilon: float = 0.0
    """An imperfect teacher for the demonstrations: each of the expert's turns is replaced,
    with this probability, by one of the env's valid commands drawn uniformly (seeded by
    ``seed``, task and turn); only the episodes it still won are cloned (and make AgentEvol's
    demonstration set). 0: the expert. The env must list its valid commands. The
    curriculum's expert turns always come from the expert itself."""

    # ----- bookkeeping -----------------------------------------------------------------
    eval_every: int = 0
    """Evaluate on the validation split every N RL steps, and then also after behaviour
    cloning and at the last step (0: never). The test panel is never played here: only
    after behaviour cloning (or at step 0 without it) and at the end of the run, for the
    before/after report."""
    val_tasks: int = 32
    """Validation tasks per ``eval_every`` evaluation: the first this many of the validation
    split, the same every time (logged as ``val_success_rate``, ``val_outcomes``; the best
    checkpoint is chosen by it)."""
    eval_tasks: int = 32
    """Test tasks of the before/after report: the first this many of the test split, played
    twice (logged as ``eval_success_rate``, ``eval_outcomes``)."""
    eval_max_turns: int | None = None
    """Turn limit of every held-out evaluation (validation and the test panel). Fixed per
    env by its layer (``envs/ENV/recipe.yaml``), so changing ``rounds`` does
    not move it; None (a config built without an env layer): the schedule's longest horizon."""
    entropy_floor: float = 0.05
    """Warn when an RL update's mean token entropy (nats) falls below this (collapse)."""
    invalid_rise: float = 0.2
    """Warn when the share of invalid actions rises more than this above the first RL step's."""
    checkpoint_every: int = 1
    """Save a checkpoint every N steps (the last step always saves)."""
    keep_checkpoints: int = 3
    """Checkpoints kept: the N newest complete ones plus the best by validation success
    (``val_success_rate``, from ``eval_every``; never the test panel); older ones are
    deleted as new ones are saved. 0 keeps all."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Where metrics go besides ``metrics.jsonl``: ``tensorboard`` (``RUN_DIR/tensorboard``),
    ``wandb`` (Weights & Biases; offline with ``WANDB_MODE=offline``); ``[]`` for neither."""
    wandb_project: str = "agentgym"
    """The W&B project of ``report_to: [wandb]`` runs (the run is named after the run folder)."""

    # ----- the regimes' own sections follow, one per preset's ``settings`` ------------------
    # (``agentevol:``, ``critique_rl:``; each with its checks, in the regime's folder)

    def __post_init__(self) -> None:
        _coerce_numbers(self)
        for name, settings in SECTIONS.items():
            if isinstance(values := getattr(self, name), dict):
                setattr(self, name, _section(name, settings, values))
        if self.algo not in PRESETS:
            hint = did_you_mean([self.algo], PRESETS)
            raise ValueError(f"unknown algo {self.algo!r}{hint}; choose one of {', '.join(PRESETS)}")
        self._from_preset = self._apply_preset()
        self.validate()

    def _apply_preset(self) -> list[str]:
        """Fill the fields left None with the algorithm's values; returns their names."""
        preset = PRESETS[self.algo]
        values = FALLBACKS | {"advantage": preset.advantage, "clip_rule": preset.clip_rule} | preset.defaults
        filled = []
        for key, value in values.items():
            head, _, leaf = key.partition(".")
            if leaf and getattr(getattr(self, head), leaf) is None:
                setattr(self, head, dataclasses.replace(getattr(self, head), **{leaf: value}))
            elif not leaf and getattr(self, key) is None:
                setattr(self, key, value)
            else:
                continue
            filled.append(key)
        return filled

    @property
    def preset(self) -> Any:
        return PRESETS[self.algo]

    @property
    def longest_horizon(self) -> int:
        """The schedule's longest turn limit (ScalingInter-RL's last round, or ``max_turns``)."""
        return schedule_of(self).longest

    @property
    def eval_horizon(self) -> int:
        return self.eval_max_turns or self.longest_horizon

    @property
    def norm_tokens(self) -> int:
        """Dr. GRPO's constant per-episode token budget (``seq-sum-norm``)."""
        return self.loss_norm_tokens or self.max_new_tokens * self.longest_horizon

    def validate(self) -> None:
        """Raise one ValueError naming every problem (:func:`config_problems`)."""
        problems = config_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    # ----- files -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls.from_dict(yaml.safe_load(Path(path).read_text()) or {})

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        values = _upgrade_renamed_keys(_nest_flat_keys(values))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(unknown_keys_message(unknown))
        return cls(**values)

    @classmethod
    def keys(cls) -> list[str]:
        """Every key ``--set`` takes, nested fields dotted (``bapo.rho0``)."""
        keys = []
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            nested = dataclasses.fields(default) if dataclasses.is_dataclass(default) else ()
            keys += [f"{f.name}.{n.name}" for n in nested] or [f.name]
        return keys

    def with_overrides(self, overrides: dict[str, Any]) -> TrainConfig:
        """``{"bapo.rho0": 0.5, "steps": 8}`` -> a new config (dotted keys reach nested configs).
        Fields the algorithm filled in are filled anew, so ``algo=dapo`` brings DAPO's values."""
        values = self.to_dict()
        for key in self._from_preset:
            head, _, leaf = key.partition(".")
            if leaf:
                values[head][leaf] = None
            else:
                values[key] = None
        for key, value in overrides.items():
            head, _, rest = FLAT_KEYS.get(key, key).partition(".")
            if rest:
                free_form = head in FREE_FORM_FIELDS  # env_settings.KEY: the env checks its keys
                if not isinstance(values.get(head), dict) or (rest not in values[head] and not free_form):
                    raise ValueError(unknown_keys_message([key]))
                values[head][rest] = value
            else:
                values[head] = value
        return TrainConfig.from_dict(values)


SECTIONS: dict[str, type] = {
    f.name: f.default_factory
    for f in dataclasses.fields(TrainConfig)
    if dataclasses.is_dataclass(f.default_factory)
}
"""The nested sections (``clip``, ``bapo``, the regimes'), by field name."""

FLAT_KEYS: dict[str, str] = {
    f"{settings.FLAT_PREFIX}{leaf.name}": f"{name}.{leaf.name}"
    for name, settings in SECTIONS.items()
    if hasattr(settings, "FLAT_PREFIX")
    for leaf in dataclasses.fields(settings)
}
"""Top-level keys of earlier versions that now live in a regime's section, and where
(``evol_iterations`` -> ``agentevol.iterations``): configs and run folders that use them
still load."""


def _nest_flat_keys(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every key of :data:`FLAT_KEYS` moved into its section."""
    nested = dict(values)
    for flat in values.keys() & FLAT_KEYS.keys():
        head, _, leaf = FLAT_KEYS[flat].partition(".")
        section = nested.get(head) or {}
        if dataclasses.is_dataclass(section):
            section = dataclasses.asdict(section)
        nested[head] = {**section, leaf: nested.pop(flat)}
    return nested


def _upgrade_renamed_keys(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with keys of earlier versions in today's terms, so their run folders load:
    ``bf16: false`` was ``dtype: float32`` (``true`` was ``auto``, the default)."""
    upgraded = dict(values)
    if "bf16" in upgraded and not upgraded.pop("bf16"):
        upgraded["dtype"] = "float32"
    return upgraded
