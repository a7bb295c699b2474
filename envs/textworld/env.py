"""``TextWorldEnv``: TextWorld's challenge games (tw-simple, tw-cooking, tw-coin_collector,
tw-treasure_hunter) behind the AgentGym ``TextEnv`` contract.

Games are generated on first use (or ahead of time by :meth:`TextWorldEnv.warm_up`) by the
shared :mod:`~agentgym.envs.textworld.store` and played with ``textworld.start``.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import textworld

from agentgym.contract.cache import cache_dir as agentgym_cache_dir
from agentgym.contract.core import ActionRules, Task, TaskListsMixin, TextEnv, Transition
from agentgym.contract.errors import InvalidAction
from agentgym.envs.textworld.store import GameStore, game_store
from agentgym.envs.textworld.tasks import DIFFICULTIES, HARDER, build_tasks, game_spec

DEFAULT_CHALLENGES = ("tw-coin_collector", "tw-treasure_hunter", "tw-simple", "tw-cooking")
DEFAULT_MAX_TURNS = {"easy": 30, "medium": 50, "hard": 80}
CACHE_LAYOUT = f"v1-textworld{textworld.__version__}"
"""Cache subfolder: bump the prefix when generation changes, so stale games are not reused."""

# Jericho warns on every load that it cannot read TextWorld's score itself; TextWorld
# supplies score, won and lost from its own game state, so the warning is noise.
warnings.filterwarnings("ignore", message=r"Game .* is not fully supported", module="jericho")

REQUEST_INFOS = textworld.EnvInfos(
    admissible_commands=True,
    policy_commands=True,
    objective=True,
    max_score=True,
    score=True,
    won=True,
    lost=True,
)

_LOAD_LOCK = threading.Lock()
"""Serialises game loading: TextWorld parses a game's logic with one module-level parser
that breaks when two threads use it at once (measured: concurrent resets crashed inside
tatsu). Loading takes milliseconds; steps run unlocked, each game has its own engine."""

INSTRUCTION = """\
You are playing a text adventure game. Each turn you read what you see and type one \
command; the game answers with what happened. The first message states your goal; \
reach it in as few turns as you can.

Commands are short imperative phrases, one per turn, for example: look, inventory, \
go north, go east, examine cookbook, take coin, take apple from fridge, open door, \
unlock door with key, put apple on table, insert key into box, cook potato with stove, \
slice carrot with knife, prepare meal, eat meal.

Reply with the command only."""

Z_MACHINE_ACTIONS = ActionRules(
    max_chars=198,  # = max_bytes: the actions are ASCII
    max_bytes=198,
    normal_form="NFKC",
    allowed=re.compile(r"[ -~]"),
    allowed_doc="printable ASCII only (the Z-machine reads ZSCII, and game vocabularies are ASCII)",
    forbidden="\\",
)
"""Jericho hands actions to a C Z-machine interpreter (frotz): NUL or 0x0E-0x15 in an
action made it segfault, a leading backslash starts one of frotz's own meta-commands
(``\\help``) that waits for more input for ever, and it reads 198 bytes at most (jericho
cut longer actions, mid-character too). NFKC first folds full-width letters and the like
into ASCII."""

META_VERBS = (
    "save",
    "restore",
    "restart",
    "undo",
    "quit",
    "script",
    "transcript",
    "unscript",
    "noscript",
)
"""The interpreter's out-of-world verbs, refused anywhere in an action. ``save`` wrote
``game.qzl`` into the server's working directory and a ``restore`` in any later session
loaded it (a reward hack across sessions); ``script``/``transcript`` wrote a transcript
file named after the whole command. Anywhere, not only first: the parser runs commands
chained with ``.`` and ``then`` (``look. save``). No TextWorld vocabulary uses these
words, so no game command is lost. Not ``q``: quitting ends only the session's own game,
and a one-letter word turns up in free and random text (Gymnasium's ``check_env`` samples)."""
_DICTIONARY_LETTERS = 9
"""A Z-machine (v5+) dictionary word is its first 9 letters: ``transcripts`` is ``transcript``."""
_META_WORDS = {verb[:_DICTIONARY_LETTERS]: verb for verb in META_VERBS}
_WORDS = re.compile(r"[a-z]+")

_BANNER = re.compile(r"^(?:[ \t_|\\/$<>]*\n)+")
"""The leading ASCII-art lines (only drawing characters) of the opening text."""
_STATUS_BAR = re.compile(r"\n?>\s*(?:-= .*? =-\s*\d+/\d+)?\s*$")
_GAME_OVER_PROMPT = re.compile(r"\s*Would you like to RESTART, RESTORE.*$", re.DOTALL)
_BLANK_LINES = re.compile(r"\n{3,}")


def clean_feedback(text: str) -> str:
    """TextWorld's text minus its trailing prompt/status bar, end-of-game menu and
    runs of blank lines."""
    text = _GAME_OVER_PROMPT.sub("", text)
    text = _STATUS_BAR.sub("", text)
    return _BLANK_LINES.sub("\n\n", text).strip()


def first_observation(feedback: str) -> str:
    """The opening text without the ASCII-art banner: the goal, then the first room."""
    return clean_feedback(_BANNER.sub("", feedback, count=1))


class TextWorldEnv(TaskListsMixin, TextEnv):
    """Text adventures generated by TextWorld's challenge generators.

    Args:
        challenges: which challenges to mix, in round-robin order.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``: the preset settings variants
            per challenge (see ``tasks.DIFFICULTIES``).
        settings: overrides the preset per challenge, e.g.
            ``{"tw-coin_collector": [{"level": 5}], "tw-cooking": [{"recipe": 2, "go": 6}]}``.
        n_train / n_validation / n_test: tasks per split (own seed ranges, see ``tasks.py``).
        n_ood: tasks of the ``ood`` split, the out-of-distribution panel: the next harder
            difficulty's presets on held-out seeds (none for ``hard``).
        cache_dir: where compiled games live (default: ``$AGENTGYM_CACHE/textworld``, see :func:`agentgym.contract.cache.cache_dir`).
        max_turns: turn limit (default by difficulty: 30 / 50 / 80).
        workers: generation processes for this cache folder (shared by all instances).
        prefetch: whether :meth:`warm_up` queues every train and test game in the background.
    """

    name: ClassVar[str] = "textworld"
    description: ClassVar[str] = (
        "TextWorld text adventures (coin collector, treasure hunter, simple house chores, "
        "cooking) generated from TextWorld's challenge generators."
    )
    action_format: ClassVar[str] = "one short imperative command, e.g. 'go north', 'take coin'"
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    default_max_turns: ClassVar[int] = DEFAULT_MAX_TURNS["easy"]
    action_rules: ClassVar[ActionRules] = Z_MACHINE_ACTIONS
    engine_process: ClassVar[bool] = True

    def __init__(
        self,
        *,
        challenges: Sequence[str] = DEFAULT_CHALLENGES,
        difficulty: str = "easy",
        settings: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        n_train: int = 32,
        n_test: int = 32,
        n_validation: int = 32,
        n_ood: int = 32,
        cache_dir: str | os.PathLike[str] | None = None,
        max_turns: int | None = None,
        workers: int = 1,
        prefetch: bool = True,
    ) -> None:
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {sorted(DIFFICULTIES)}")
        if not challenges or not set(challenges) <= set(DEFAULT_CHALLENGES):
            raise ValueError(f"challenges must be a non-empty subset of {DEFAULT_CHALLENGES}")
        super().__init__(max_turns=max_turns or DEFAULT_MAX_TURNS[difficulty])
        variants = {c: (settings or {}).get(c) or DIFFICULTIES[difficulty][c] for c in challenges}
        # Validation after test: the wire's split-after-split numbering (data_idx) of train
        # and test tasks stays what it was before validation existed.
        self._tasks = {
            "train": build_tasks("train", n_train, variants),
            "test": build_tasks("test", n_test, variants),
            "validation": build_tasks("validation", n_validation, variants),
        }
        if difficulty in HARDER:
            harder = {c: DIFFICULTIES[HARDER[difficulty]][c] for c in challenges}
            self._tasks["ood"] = build_tasks("ood", n_ood, harder)
        root = Path(cache_dir) if cache_dir is not None else agentgym_cache_dir("textworld")
        self.store: GameStore = game_store(root / CACHE_LAYOUT, workers)
        self.prefetch = prefetch
        self._game: Any = None  # the running textworld environment
        self._state: Any = None  # its latest GameState

    # ----- catalogue -------------------------------------------------------------------

    def instruction(self) -> str:
        return INSTRUCTION

    @classmethod
    def validate_action(cls, action: object) -> str:
        """The Z-machine rules, then InvalidAction (400) for any :data:`META_VERBS`."""
        action = super().validate_action(action)
        words = (word[:_DICTIONARY_LETTERS] for word in _WORDS.findall(action.lower()))
        refused = sorted({_META_WORDS[word] for word in words if word in _META_WORDS})
        if refused:
            raise InvalidAction(
                f"action uses the interpreter's meta-verb(s) {', '.join(refused)}, which this "
                f"environment refuses (no saving, restoring, restarting, undoing, quitting or transcripts)"
            )
        return action

    def warm_up(self) -> None:
        """Queue the train and test games for background generation (interleaved, in list
        order) and return at once. Validation and ood games are generated on first use: a
        run that never evaluates there never pays for them."""
        if not self.prefetch:
            return
        train, test = self._tasks["train"], self._tasks["test"]
        interleaved = [t for pair in zip(train, test, strict=False) for t in pair]
        rest = train[len(test) :] + test[len(train) :]
        self.store.prefetch(game_spec(t) for t in interleaved + rest)

    def warm_engines(self, count: int) -> None:
        """Play one reset of a cached game in this process (servers' ``--warm``), so that no
        session's first reset pays for loading TextWorld, jericho and the game grammar.
        A textworld engine is a plain object with nothing to keep started, so ``count``
        only says whether to warm (0: not). Nothing is generated here: with no game cached
        yet, the first reset waits for its game anyway."""
        if count <= 0:
            return
        cached = (
            t
            for split in ("test", "train", "validation")
            for t in self._tasks[split]
            if self.store.cached(t.task_id)
        )
        task = next(cached, None)
        if task is not None:
            self.reset(task_id=task.task_id)
            self.close()

    def game_file(self, task_id: str) -> str:
        """The compiled game of ``task_id``, generated first (ahead of any prefetch) if need
        be. Sessions ask the catalog instance for it (:meth:`on_catalog`), so a server's
        sessions share one generation queue whichever process hosts their engines."""
        return str(self.store.game_file(game_spec(self.task(task_id))))

    # ----- episode ---------------------------------------------------------------------

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        # Games are fully determined by the task; ``seed`` only picks a task (base class).
        path = self.on_catalog("game_file", task.task_id)
        self.close()
        with _LOAD_LOCK:
            self._game = textworld.start(str(path), request_infos=REQUEST_INFOS)
            self._state = self._game.reset()
        return self._transition(first_observation(self._state.feedback))

    def _step(self, action: str) -> Transition:
        self._state, _, _ = self._game.step(action)
        return self._transition(clean_feedback(self._state.feedback))

    def _transition(self, observation: str) -> Transition:
        state = self._state
        score = state.score / state.max_score if state.max_score else 0.0
        return Transition(
            observation=observation,
            score=min(max(score, 0.0), 1.0),
            won=bool(state.won),
            lost=bool(state.lost),
            extra={"raw_score": state.score, "max_score": state.max_score},
        )

    def available_actions(self) -> list[str] | None:
        if self._state is None:
            return None
        return sorted(self._state.admissible_commands or [])

    def expert_action(self) -> str | None:
        # policy_commands is recomputed by TextWorld after every step, so it stays right
        # after the agent strays from the walkthrough.
        if self._state is None or self.done or not self._state.policy_commands:
            return None
        return self._state.policy_commands[0]

    def close(self) -> None:
        game, self._game, self._state = self._game, None, None
        if game is not None:
            game.close()
