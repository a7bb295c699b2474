"""The built-in dataset: a generated knowledge base rendered as encyclopedia passages,
and multi-hop questions over it.

**World.** Countries, cities, universities, people, films, novels and companies with
functional relations (a film has one director, a person one birthplace, ...), every
name invented from syllables and word lists, so answers cannot come from a model's
memory and each question has exactly one verifiable answer. Each entity gets one
passage that states its own facts and nothing else, so a k-hop question needs k lookups.

**Distractors** (``distractors`` per entity, 0-3) make retrieval harder: a *namesake*
(another entity of the same kind with a confusable name, e.g. "The Glass Harbor II"
directed by someone else) and a *mention* (a passage that names the entity next to a
wrong but plausible answer, e.g. a festival in another city that a person attended).

**Questions.** A k-hop question follows a chain of k relations from a start entity;
the question nests the chain ("In which country is the birthplace of the director of the
film The Glass Harbor?") and each hop has a gold query ("Who directed the film The Glass
Harbor?", "In which city was Orla Venmark born?", ...) whose answer passage is the gold
document of that hop. Start entities are split 80/20 into train and test by a hash of
their name, so the splits share no question; question ``seed`` picks the start and the
chain. Validation questions start from train's entities with seeds of their own (each
split's seeds lie in its own range, :data:`SEED_OFFSETS`), and skip any question the train
split holds, so test's entities stay unseen until the final report. Everything is a pure
function of ``(kb_seed, scale, distractors)`` and the seed.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

from agentgym.envs.search.data import Passage, Question
from agentgym.envs.search.vocabulary import (
    ADJECTIVES,
    COMPANY_SUFFIXES,
    CURRENCY_UNITS,
    GENRES,
    INDUSTRIES,
    NOUNS,
    NOVEL_GENRES,
    OCCUPATIONS,
    SYLLABLES,
)

GENERATOR_VERSION = 2
"""Bump when generation changes, so cached indexes of the old corpus are not reused."""

TEST_SEED_OFFSET = 1_000_000
SEED_OFFSETS = {"train": 0, "validation": 500_000, "test": TEST_SEED_OFFSET}
SEED_RANGE = 500_000
"""Seeds a split may try: split ``s`` draws from ``SEED_OFFSETS[s]`` up to this many more."""
TEST_SHARE = 5
"""One start entity in ``TEST_SHARE`` (by name hash) belongs to the test split."""
MAX_DISTRACTORS = 3

SIZES = {
    "country": 8,
    "city": 40,
    "university": 20,
    "person": 160,
    "film": 100,
    "book": 80,
    "company": 50,
}
"""Entities of each kind at ``scale=1`` (about 460 entities; passages = entities x (1 + distractors))."""


@dataclass(frozen=True)
class Relation:
    """A functional relation: ``target`` is the object's kind, or ``None`` for a literal.

    ``question`` asks for the object of ``{x}``; ``phrase`` names it inside a longer
    question (literals end a chain, so they have none).
    """

    name: str
    subject: str
    target: str | None
    question: str
    phrase: str | None = None


RELATIONS = (
    Relation("director", "film", "person", "Who directed the film {x}?", "the director of the film {x}"),
    Relation("release_year", "film", None, "In what year was the film {x} released?"),
    Relation("author", "book", "person", "Who wrote the novel {x}?", "the author of the novel {x}"),
    Relation("publication_year", "book", None, "In what year was the novel {x} first published?"),
    Relation(
        "founder", "company", "person", "Who founded the company {x}?", "the founder of the company {x}"
    ),
    Relation(
        "headquarters",
        "company",
        "city",
        "In which city is the company {x} headquartered?",
        "the city where the company {x} is headquartered",
    ),
    Relation("birthplace", "person", "city", "In which city was {x} born?", "the birthplace of {x}"),
    Relation(
        "alma_mater",
        "person",
        "university",
        "Which university did {x} attend?",
        "the university that {x} attended",
    ),
    Relation("birth_year", "person", None, "In what year was {x} born?"),
    Relation(
        "campus", "university", "city", "In which city is {x} located?", "the city where {x} is located"
    ),
    Relation("founding_year", "university", None, "In what year was {x} founded?"),
    Relation("country", "city", "country", "In which country is {x}?", "the country of {x}"),
    Relation("capital", "country", "city", "What is the capital of {x}?", "the capital of {x}"),
    Relation("currency", "country", None, "What is the currency of {x}?"),
)
RELATIONS_OF = {kind: [r for r in RELATIONS if r.subject == kind] for kind in SIZES}

PASSAGES = {
    "film": "{name} is {a_release_year} {genre} film directed by {director}. It was released in {release_year}.",
    "book": "{name} is {a_genre} novel written by {author}, first published in {publication_year}.",
    "company": "{name} is {a_industry} company founded by {founder}. The company is headquartered in the city of {headquarters}.",
    "person": "{name} is {occupation} born in {birth_year} in the city of {birthplace}. {name} attended {alma_mater}.",
    "university": "{name} is a university located in the city of {campus}. It was founded in {founding_year}.",
    "city": "{name} is a city in the country of {country}. It has about {population} inhabitants.",
    "country": "{name} is a country whose capital is the city of {capital}. Its currency is the {currency}.",
}
MENTIONS = {
    "film": "{other} is a film critic who wrote a long essay on the film {name} after a screening in the city of {city}.",
    "book": "{other} is a literary critic who reviewed the novel {name} in {year} while living in the city of {city}.",
    "company": "{other} worked at the company {name} before moving to the city of {city} in {year}.",
    "person": "The {other} Festival took place in the city of {city} in {year}. Its guest of honour was {name}, who attended the opening.",
    "university": "{other} taught at {name} and later opened a school in the city of {city} in {year}.",
    "city": "The {other} Fair is held every year in the city of {name}. Delegations from the country of {country} attend it.",
    "country": "{other} served as ambassador to {name} and lived in the city of {city} from {year}.",
}
"""Distractor passages that name an entity next to a wrong but plausible answer."""
NAMESAKES = {
    "film": ("{} II", "Return to {}"),
    "book": ("{} II", "Beyond {}"),
    "company": ("{} International", "New {}"),
    "university": ("{} College", "{} Institute"),
    "city": ("New {}", "{} Springs"),
    "country": ("North {}", "South {}"),
}


_AN_NUMBER = re.compile(r"8|1[18](\d\d)?(?!\d)")
"""Numbers read with a leading vowel sound: eight..., eleven, eighteen, 11xx and 18xx
("an 1897 film": eighteen ninety-seven)."""


def indefinite_article(word: str) -> str:
    """``a`` or ``an`` before ``word``, by sound for numbers and by first letter otherwise
    (enough for the generator's genres, industries and years)."""
    vowel_sound = _AN_NUMBER.match(word) if word[:1].isdigit() else word[:1].lower() in "aeiou"
    return "an" if vowel_sound else "a"


def with_articles(values: dict[str, str]) -> dict[str, str]:
    """``values`` plus ``a_<key>`` = the value with its article, for templates that say
    "{a_release_year} film" ("a 1982 film", "an 1897 film", "an adventure novel")."""
    return {**values, **{f"a_{key}": f"{indefinite_article(value)} {value}" for key, value in values.items()}}


@dataclass(eq=False)
class Entity:
    """A node of the world; ``facts`` maps relation names to entities or literal strings."""

    kind: str
    name: str
    doc_id: str = ""
    facts: dict[str, Entity | str] = field(default_factory=dict)
    attrs: dict[str, str] = field(default_factory=dict)

    def fact_text(self, relation: str) -> str:
        value = self.facts[relation]
        return value.name if isinstance(value, Entity) else value


class KnowledgeBase:
    """A generated world: its passages and its questions (see the module docstring).

    Args:
        seed: the world's random seed.
        scale: size multiplier over :data:`SIZES`.
        distractors: distractor passages per entity, 0 to 3.
    """

    def __init__(self, seed: int = 0, scale: int = 1, distractors: int = 2) -> None:
        if not 0 <= distractors <= MAX_DISTRACTORS:
            raise ValueError(f"distractors must be 0 to {MAX_DISTRACTORS}, not {distractors}")
        if scale < 1:
            raise ValueError(f"scale must be at least 1, not {scale}")
        self.seed, self.scale, self.distractors = seed, scale, distractors
        self._rng = random.Random(seed)
        self._names: set[str] = set()
        self.entities = self._build_world()
        self.passages = self._render_passages()

    # ----- world -----------------------------------------------------------------------

    def _build_world(self) -> dict[str, list[Entity]]:
        # Kinds are created in dependency order: facts point at entities made before.
        world = {kind: [self._entity(kind) for _ in range(n * self.scale)] for kind, n in SIZES.items()}
        for index, city in enumerate(world["city"]):
            city.facts["country"] = world["country"][index % len(world["country"])]
        for country, city in zip(world["country"], world["city"], strict=False):
            country.facts["capital"] = city  # the first city of each country lies in it
        for kind in SIZES:
            for entity in world[kind]:
                self._fill_facts(entity, world)
        return world

    def _entity(self, kind: str) -> Entity:
        return Entity(kind, self._unique(lambda _: self._fresh_name(kind)), attrs=self._attrs(kind))

    def _fill_facts(self, entity: Entity, world: dict[str, list[Entity]]) -> None:
        """Draw every relation of ``entity`` not set yet: an entity of the target kind, or
        a literal (a year, a currency)."""
        for relation in RELATIONS_OF[entity.kind]:
            if relation.name in entity.facts:
                continue
            if relation.target is not None:
                entity.facts[relation.name] = self._rng.choice(world[relation.target])
            elif relation.name == "currency":
                entity.facts[relation.name] = f"{self._word()} {self._rng.choice(CURRENCY_UNITS)}"
            else:
                entity.facts[relation.name] = str(self._rng.randint(1850, 2020))

    def _attrs(self, kind: str) -> dict[str, str]:
        """Descriptive words no question asks about (they make passages read naturally)."""
        rng = self._rng
        return {
            "genre": rng.choice(NOVEL_GENRES if kind == "book" else GENRES),
            "occupation": rng.choice(OCCUPATIONS),
            "industry": rng.choice(INDUSTRIES),
            "population": f"{rng.randint(20, 2000) * 1000:,}",
        }

    # ----- names -----------------------------------------------------------------------

    def _word(self, min_syllables: int = 2, max_syllables: int = 3) -> str:
        count = self._rng.randint(min_syllables, max_syllables)
        return "".join(self._rng.choice(SYLLABLES) for _ in range(count)).capitalize()

    def _fresh_name(self, kind: str) -> str:
        rng = self._rng
        if kind == "person":
            return f"{self._word(2, 2)} {self._word()}"
        if kind in ("film", "book"):
            title = f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
            return title if title not in self._names else f"{title} of {self._word()}"
        if kind == "company":
            return f"{self._word()} {rng.choice(COMPANY_SUFFIXES)}"
        if kind == "university":
            return f"{self._word()} University"
        if kind == "country":
            return self._word(2, 2) + rng.choice(("nia", "land", "ova", "esh"))
        return self._word()

    def _unique(self, make: Callable[[int], str]) -> str:
        """``make(attempt)`` until a name is new: names are unique across the world, so a
        name always means one entity."""
        for attempt in range(1000):
            name = make(attempt)
            if name not in self._names:
                self._names.add(name)
                return name
        raise RuntimeError("ran out of fresh names; use a larger name space")

    def _namesake_name(self, entity: Entity, variant: int) -> str:
        if entity.kind == "person":  # same family name, another given name
            family = entity.name.split(" ", 1)[1]
            return self._unique(lambda _: f"{self._word(2, 2)} {family}")
        name = NAMESAKES[entity.kind][variant].format(entity.name)
        # Taken already (a "New Kelvar" may exist): add a word to keep the confusable stem.
        return self._unique(lambda attempt: name if attempt == 0 else f"{name} {self._word()}")

    # ----- passages --------------------------------------------------------------------

    def _render_passages(self) -> list[Passage]:
        passages: list[Passage] = []
        world = self.entities
        for kind in SIZES:
            for entity in world[kind]:
                passages.append(self._passage(entity, len(passages)))
                passages.extend(self._distractors(entity, world, len(passages)))
        return passages

    def _passage(self, entity: Entity, number: int) -> Passage:
        entity.doc_id = str(number)
        fields = {relation: entity.fact_text(relation) for relation in entity.facts}
        return Passage(
            entity.doc_id,
            entity.name,
            PASSAGES[entity.kind].format(name=entity.name, **with_articles({**fields, **entity.attrs})),
        )

    def _distractors(self, entity: Entity, world: dict[str, list[Entity]], first: int) -> Iterator[Passage]:
        """Namesake, mention, second namesake: the first ``distractors`` of these."""
        for slot in range(self.distractors):
            if slot == 1:
                yield self._mention(entity, world, str(first + slot))
            else:  # same kind, confusable name, facts drawn afresh
                twin = Entity(
                    entity.kind, self._namesake_name(entity, slot // 2), attrs=self._attrs(entity.kind)
                )
                self._fill_facts(twin, world)
                yield self._passage(twin, first + slot)

    def _mention(self, entity: Entity, world: dict[str, list[Entity]], doc_id: str) -> Passage:
        other = self._unique(lambda _: f"{self._word(2, 2)} {self._word()}")
        text = MENTIONS[entity.kind].format(
            name=entity.name,
            other=other,
            city=self._rng.choice(world["city"]).name,
            country=self._rng.choice(world["country"]).name,
            year=self._rng.randint(1850, 2020),
        )
        title = f"{other} Festival" if entity.kind == "person" else other
        return Passage(doc_id, title, text)

    # ----- questions -------------------------------------------------------------------

    def starts(self, split: str) -> list[Entity]:
        """Entities questions of ``split`` start from (disjoint between train and test;
        validation starts from train's)."""
        in_test = split == "test"
        return [
            entity
            for kind in SIZES
            for entity in self.entities[kind]
            if (zlib.crc32(entity.name.encode()) % TEST_SHARE == 0) == in_test
        ]

    def questions(
        self, split: str, count: int, hops: Sequence[int], exclude: Collection[str] = ()
    ) -> list[tuple[int, Question]]:
        """The first ``count`` distinct questions of ``split`` as ``(seed, question)``, none
        of whose text is in ``exclude``; question ``i`` has ``hops[i % len(hops)]`` hops.
        Growing ``count`` only appends."""
        if not hops or not set(hops) <= {1, 2, 3, 4}:
            raise ValueError(f"hops must be a non-empty list of 1 to 4, not {hops}")
        if split not in SEED_OFFSETS:
            raise ValueError(f"unknown split {split!r}; splits are {list(SEED_OFFSETS)}")
        starts, offset = self.starts(split), SEED_OFFSETS[split]
        found: list[tuple[int, Question]] = []
        seen: set[str] = set(exclude)
        for seed in range(offset, offset + min(50 * count + 100, SEED_RANGE)):
            if len(found) == count:
                return found
            question = self.question(random.Random(seed), starts, hops[len(found) % len(hops)])
            if question is not None and question.question not in seen:
                seen.add(question.question)
                found.append((seed, question))
        if len(found) < count:
            raise ValueError(f"only {len(found)} distinct {split} questions; raise kb_scale")
        return found

    def question(self, rng: random.Random, starts: list[Entity], hops: int) -> Question | None:
        """A ``hops``-hop question from a random start, or ``None`` if the chain dead-ends."""
        chain = _walk(rng, rng.choice(starts), hops)
        if chain is None:
            return None
        subjects = [entity for entity, _ in chain]
        relations = [relation for _, relation in chain]
        phrase = subjects[0].name
        for relation in relations[:-1]:
            phrase = relation.phrase.format(x=phrase)  # type: ignore[union-attr]
        answer = subjects[-1].fact_text(relations[-1].name)
        return Question(
            question=relations[-1].question.format(x=phrase),
            answers=(answer,),
            hop_queries=tuple(r.question.format(x=e.name) for e, r in chain),
            hop_docs=tuple(e.doc_id for e in subjects),
            meta={"hops": hops, "relations": [r.name for r in relations]},
        )


def _walk(rng: random.Random, start: Entity, hops: int) -> list[tuple[Entity, Relation]] | None:
    """A random chain of ``hops`` relations from ``start`` through distinct entities; the
    last may end in a literal, the others must reach an entity."""
    chain: list[tuple[Entity, Relation]] = []
    entity, visited = start, {id(start)}
    for hop in range(hops):
        last = hop == hops - 1
        options = [
            r
            for r in RELATIONS_OF[entity.kind]
            if (r.target is None and last)
            or (r.target is not None and id(entity.facts[r.name]) not in visited)
        ]
        if not options:
            return None
        relation = rng.choice(options)
        chain.append((entity, relation))
        target = entity.facts[relation.name]
        if isinstance(target, Entity):
            entity = target
            visited.add(id(entity))
    return chain
