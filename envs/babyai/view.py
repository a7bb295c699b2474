"""What the agent sees, in words, and the commands it can give from there.

The view is rebuilt after every move from minigrid's partial observation: the 7x7 cells
ahead of the agent, less what walls and closed doors hide. Objects in sight are named by
colour and type (a door also by its state: ``grey closed door``) and numbered among those
of the same name, nearest first: ``red ball 1``, ``red ball 2``. Each available command
maps to the primitive actions that carry it out, found by breadth-first search over the
cells in sight, as AgentGym's BabyAI server plans its ``go to`` / ``pickup`` / ``go
through`` commands.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE, DONE = range(7)
"""minigrid's primitive actions (``MiniGridEnv.Actions``)."""

DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))
"""minigrid's ``agent_dir`` 0-3 as a step on the grid: east, south, west, north."""

PORTABLE = ("key", "ball", "box")
TARGET = re.compile(r"(go to|pickup|go through|toggle and go through) (.+) (\d+)")

Pos = tuple[int, int]
State = tuple[int, int, int]  # x, y, direction


@dataclass(frozen=True)
class Seen:
    """An object in sight: ``kind`` (``red ball``) and ``name`` (``red ball 1``)."""

    kind: str
    name: str
    pos: Pos
    ahead: int
    right: int
    obj: Any

    def where(self) -> str:
        parts = [f"{self.ahead} step{'s' * (self.ahead != 1)} ahead"] if self.ahead else []
        if self.right:
            parts.append(f"{abs(self.right)} to your {'right' if self.right > 0 else 'left'}")
        return ", ".join(parts)


@dataclass
class View:
    """The agent's view after a move: its description and the commands available."""

    objects: list[Seen]
    front: Any
    """The object in the cell the agent faces (None: an empty cell)."""
    carrying: Any
    ahead: str
    plans: dict[str, list[int]] = field(default_factory=dict)
    """Each available command -> the primitive actions that carry it out."""

    def describe(self) -> str:
        seen = ", ".join(f"{s.name} ({s.where()})" for s in self.objects)
        carried = f"a {self.carrying.color} {self.carrying.type}" if self.carrying else "nothing"
        lines = [
            f"In view: {seen}." if seen else "You see no objects.",
            f"Straight ahead: {self.ahead}.",
            f"You are carrying {carried}.",
        ]
        return "\n".join(lines)

    def actions_line(self) -> str:
        return f"Available actions: {json.dumps(list(self.plans))}"

    def name_at(self, pos: Pos) -> str | None:
        """The name of the object in sight at ``pos``."""
        return next((s.name for s in self.objects if s.pos == tuple(pos)), None)

    def front_name(self) -> str | None:
        """The name of the object the agent faces, if it is one in sight."""
        return next(
            (s.name for s in self.objects if s.obj is self.front and s.ahead == 1 and not s.right), None
        )

    def refusal(self, command: str) -> str:
        """Why ``command`` (well-formed or not) cannot be carried out now."""
        if command in ("move forward", "drop", "toggle"):
            return self._refuse_here(command)
        if command == "pickup":
            return "There is nothing in front of you to pick up."
        if command == "go to goal":
            return "You see no goal you can reach."
        target = TARGET.fullmatch(command)
        if target is None:
            return f"Unknown action: {command!r}."
        verb, kind, number = target.groups()
        seen = next((s for s in self.objects if s.name == f"{kind} {number}"), None)
        if seen is None:
            return f"You see no {kind} {number}."
        if verb == "pickup" and self.carrying:
            return f"You are already carrying a {self.carrying.color} {self.carrying.type}: drop it first."
        if verb == "pickup" and seen.obj.type not in PORTABLE:
            return f"You cannot pick up the {seen.name}."
        if "go through" in verb and seen.obj.type != "door":
            return f"The {seen.name} is not a door."
        if verb == "go through" and not seen.obj.is_open:
            return f"The {seen.name} is not open: toggle it first."
        if verb == "toggle and go through" and seen.obj.is_locked:
            return f"The {seen.name} is locked: you need to carry a {seen.obj.color} key."
        return f"There is no way to {command} from here."

    def _refuse_here(self, command: str) -> str:
        thing = f"a {self.front.color} {self.front.type}" if self.front else "nothing"
        if command == "move forward":
            return f"You cannot move forward: there is {thing} in front of you."
        if command == "drop":
            if not self.carrying:
                return "You are not carrying anything."
            return f"You cannot drop it here: there is {thing} in front of you."
        if self.front is not None and self.front.type == "door" and self.front.is_locked:
            return f"The door in front of you is locked: you need to carry a {self.front.color} key."
        if self.front is None:
            return "There is nothing in front of you to toggle."
        return f"You cannot toggle the {self.front.color} {self.front.type} in front of you."


def look(env: Any) -> View:
    """The view of minigrid env ``env`` (its ``unwrapped`` level) now."""
    cells = _cells_in_sight(env)
    objects = _objects(env, cells)
    front = env.grid.get(*_step(tuple(env.agent_pos), env.agent_dir))
    view = View(objects, front, env.carrying, _ahead(env, cells, objects))
    view.plans = _plans(env, cells, view)
    return view


def _step(pos: Pos, direction: int, distance: int = 1) -> Pos:
    dx, dy = DIRECTIONS[direction]
    return pos[0] + dx * distance, pos[1] + dy * distance


def _cells_in_sight(env: Any) -> dict[Pos, tuple[int, int]]:
    """Every visible cell on the grid -> (steps ahead, steps to the right) of the agent."""
    _, visible = env.gen_obs_grid()
    size = env.agent_view_size
    cells = {}
    for i in range(size):
        for j in range(size):
            ahead, right = size - 1 - j, i - size // 2
            x, y = _step(_step(tuple(env.agent_pos), env.agent_dir, ahead), (env.agent_dir + 1) % 4, right)
            if visible[i, j] and 0 <= x < env.grid.width and 0 <= y < env.grid.height:
                cells[(x, y)] = (ahead, right)
    return cells


def _objects(env: Any, cells: dict[Pos, tuple[int, int]]) -> list[Seen]:
    """The objects in sight (not walls, not what the agent carries), nearest first, numbered."""
    found = []
    for pos, (ahead, right) in cells.items():
        obj = env.grid.get(*pos)
        if obj is None or obj.type in ("wall", "floor") or (ahead, right) == (0, 0):
            continue
        kind = f"{obj.color} {_door_state(obj)}door" if obj.type == "door" else f"{obj.color} {obj.type}"
        found.append((ahead + abs(right), ahead, right, kind, pos, obj))
    found.sort(key=lambda item: item[:3])
    counts: Counter[str] = Counter()
    objects = []
    for _, ahead, right, kind, pos, obj in found:
        counts[kind] += 1
        objects.append(Seen(kind, f"{kind} {counts[kind]}", pos, ahead, right, obj))
    return objects


def _door_state(door: Any) -> str:
    return "open " if door.is_open else "locked " if door.is_locked else "closed "


def _ahead(env: Any, cells: dict[Pos, tuple[int, int]], objects: list[Seen]) -> str:
    """What blocks the way straight ahead, or how far it is clear."""
    names = {id(s.obj): s.name for s in objects}
    distance = 1
    while (pos := _step(tuple(env.agent_pos), env.agent_dir, distance)) in cells:
        cell = env.grid.get(*pos)
        if not passable(cell):
            what = names.get(id(cell), f"a {cell.type}")
            return f"{what}, {distance} step{'s' * (distance != 1)} away"
        distance += 1
    clear = distance - 1
    return f"clear for {clear} step{'s' * (clear != 1)}, then out of sight"


def passable(cell: Any) -> bool:
    """Whether the agent can step onto ``cell`` (lava it could, but never should)."""
    return cell is None or (cell.can_overlap() and cell.type != "lava")


def _search(env: Any, cells: dict[Pos, tuple[int, int]]) -> dict[State, tuple[State, int] | None]:
    """Breadth-first search from the agent over the passable cells in sight: every state
    reached -> (the state before, the action from it), in the order reached."""
    start = (*env.agent_pos, env.agent_dir)
    parents: dict[State, tuple[State, int] | None] = {start: None}
    frontier = [start]
    for x, y, d in frontier:  # grows while it is read: a queue
        moves = [(LEFT, (x, y, (d - 1) % 4)), (RIGHT, (x, y, (d + 1) % 4))]
        ahead = _step((x, y), d)
        if ahead in cells and passable(env.grid.get(*ahead)):
            moves.insert(0, (FORWARD, (*ahead, d)))
        for action, state in moves:
            if state not in parents:
                parents[state] = ((x, y, d), action)
                frontier.append(state)
    return parents


def _path(parents: dict[State, tuple[State, int] | None], accept: Any) -> list[int] | None:
    """The actions to the first state reached that ``accept(x, y, d)`` takes, or None."""
    goal = next((state for state in parents if accept(*state)), None)
    if goal is None:
        return None
    actions = []
    while (link := parents[goal]) is not None:
        goal, action = link
        actions.append(action)
    return actions[::-1]


def _plans(env: Any, cells: dict[Pos, tuple[int, int]], view: View) -> dict[str, list[int]]:
    plans = {"turn left": [LEFT], "turn right": [RIGHT]}
    if passable(view.front):
        plans["move forward"] = [FORWARD]
    if view.carrying and view.front is None:
        plans["drop"] = [DROP]
    if _toggles(view.front, view.carrying):
        plans["toggle"] = [TOGGLE]
    parents = _search(env, cells)
    for seen in view.objects:
        plans |= _object_plans(seen, parents, view.carrying)
    return plans


def _toggles(obj: Any, carrying: Any) -> bool:
    """Whether toggling ``obj`` does something: a box opens, a door opens or closes (a
    locked one only with a key of its colour)."""
    if obj is None or obj.type not in ("door", "box"):
        return False
    key = carrying is not None and carrying.type == "key" and carrying.color == obj.color
    return obj.type == "box" or not obj.is_locked or key


def _object_plans(seen: Seen, parents: dict, carrying: Any) -> dict[str, list[int]]:
    """The commands about one object in sight that have a path."""
    plans = {}
    if seen.obj.type == "goal":
        arrive = _path(parents, lambda x, y, d: (x, y) == seen.pos)
        return {} if arrive is None else {"go to goal": arrive}
    face = _path(parents, lambda x, y, d: _step((x, y), d) == seen.pos)
    if face is None:
        return {}
    # Already facing it: minigrid's no-op ``done`` lets the level check a "go to" mission.
    plans[f"go to {seen.name}"] = face or [DONE]
    if seen.obj.type in PORTABLE and carrying is None:
        plans[f"pickup {seen.name}"] = [*face, PICKUP]
    if seen.obj.type == "door" and seen.obj.is_open:
        arrive = _path(parents, lambda x, y, d: (x, y) == seen.pos)
        if arrive is not None:  # into the doorway, then one step on through it
            plans[f"go through {seen.name}"] = [*arrive, FORWARD]
    elif seen.obj.type == "door" and _toggles(seen.obj, carrying):
        plans[f"toggle and go through {seen.name}"] = [*face, TOGGLE, FORWARD, FORWARD]
    return plans
