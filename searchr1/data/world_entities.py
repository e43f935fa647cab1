"""The entities of the generated world and the facts that link them.

``build_entities`` draws people, cities, organisations and creative works with their
relations (see ``world_relations.RELATIONS``) from one seeded RNG, then adds distractor
entities: near-duplicate names ("Drennick Labs" / "Drennick Laboratories") with facts drawn
afresh, so a model that reads a retrieved passage carelessly answers with the wrong fact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from searchr1.data.world_names import NameMaker
from searchr1.data.world_relations import FORMS, RELATION_BY_NAME

PROFESSIONS = ("violinist", "cartographer", "glassblower", "botanist", "architect",
               "stonemason", "astronomer", "playwright", "engineer", "chemist", "shipwright",
               "bookbinder", "physician", "clockmaker", "sculptor", "printer", "weaver",
               "lawyer", "surveyor", "photographer")
INDUSTRIES = ("shipbuilding", "publishing", "glassmaking", "brewing", "printing", "textile",
              "instrument-making", "mining", "banking", "pharmaceutical", "film", "railway")


@dataclass
class Entity:
    """One world entity: relation facts (entity ids or literals) plus rendering details.

    ``facts`` are what questions ask about; ``attrs`` only flavour the passages (pronouns,
    a work's form, an organisation's industry and former name, noise years).
    """

    id: str
    kind: str
    name: str
    facts: dict[str, object] = field(default_factory=dict)
    attrs: dict[str, object] = field(default_factory=dict)
    twin_of: str | None = None


@dataclass
class World:
    """All entities by id, in creation order (which fixes passage order)."""

    entities: dict[str, Entity]

    def of_kind(self, kind: str) -> list[Entity]:
        """Entities of one kind, in creation order."""
        return [e for e in self.entities.values() if e.kind == kind]

    def value_name(self, entity: Entity, relation: str) -> str:
        """A fact's value as text: the target entity's name, or the literal itself."""
        value = entity.facts[relation]
        if RELATION_BY_NAME[relation].to_entity:
            return self.entities[str(value)].name
        return str(value)

    def fields(self, entity: Entity) -> dict[str, str]:
        """Template fields for phrasing about ``entity``: its facts and attrs as text."""
        out = {key: str(value) for key, value in entity.attrs.items()}
        out.update({rel: self.value_name(entity, rel) for rel in entity.facts})
        if entity.kind == "work":
            out.update(vars(FORMS[str(entity.attrs["form"])]))
        return out


class _Builder:
    """Draws entities in dependency order: places, people, organisations, works."""

    def __init__(self, rng: random.Random, distractor_ratio: float) -> None:
        self.rng = rng
        self.ratio = distractor_ratio
        self.names = NameMaker(rng)
        self.first_names = self.names.first_names(48)
        self.regions = [self.names.single() for _ in range(8)]
        self.rivers = [self.names.single() for _ in range(12)]
        self.entities: dict[str, Entity] = {}

    def add(self, kind: str, name: str, twin_of: str | None = None) -> Entity:
        """Register a new entity with a sequential id such as ``person_12``."""
        count = sum(1 for e in self.entities.values() if e.kind == kind)
        entity = Entity(f"{kind}_{count}", kind, name, twin_of=twin_of)
        self.entities[entity.id] = entity
        return entity

    def population(self, kind: str, count: int, make_name, fill) -> list[Entity]:
        """``count`` entities plus near-duplicate twins, each filled by ``fill(entity)``."""
        base = [self.add(kind, make_name()) for _ in range(count)]
        originals = self.rng.sample(base, round(count * self.ratio))
        twins = [self.add(kind, self.names.variant(o.name, kind, self.first_names), o.id)
                 for o in originals]
        for entity in base + twins:
            fill(entity)
        return base + twins

    def fill_city(self, city: Entity) -> None:
        """Province, river, founding year, and noise details of a city."""
        city.facts.update(region=self.rng.choice(self.regions), river=self.rng.choice(self.rivers),
                          city_founded=self.rng.randint(900, 1750))
        city.attrs.update(population=self.rng.randrange(8, 900) * 1000,
                          charter=int(city.facts["city_founded"]) + self.rng.randint(20, 250))

    def fill_person(self, person: Entity, cities: list[Entity]) -> None:
        """Birth, profession and death of a person; the employer comes later."""
        born = self.rng.randint(1780, 1925)
        person.facts.update(born_year=born, born_in=self.rng.choice(cities).id,
                            profession=self.rng.choice(PROFESSIONS),
                            died_in=self.rng.choice(cities).id)
        he, his = self.rng.choice((("he", "his"), ("she", "her")))
        person.attrs.update(he=he, his=his, parent_job=self.rng.choice(PROFESSIONS),
                            died_year=born + self.rng.randint(45, 95),
                            joined=born + self.rng.randint(18, 35))

    def fill_org(self, org: Entity, people: list[Entity], cities: list[Entity]) -> None:
        """Founder, founding year, headquarters, industry and former name of an organisation."""
        founder = self.rng.choice(people)
        founded = int(founder.facts["born_year"]) + self.rng.randint(22, 60)
        org.facts.update(founder=founder.id, org_founded=founded, hq=self.rng.choice(cities).id)
        org.attrs.update(industry=self.rng.choice(INDUSTRIES),
                         staff=self.rng.randrange(2, 400) * 25,
                         renamed=founded + self.rng.randint(5, 60))
        if self.rng.random() < 0.6:
            org.attrs["alias"] = self.names.org()

    def fill_work(self, work: Entity, people, cities, orgs) -> None:
        """Creator, form, first showing (year, city, organisation) and alternative title."""
        creator = self.rng.choice(people)
        work.facts.update(creator=creator.id,
                          work_year=int(creator.facts["born_year"]) + self.rng.randint(20, 60),
                          premiere=self.rng.choice(cities).id, publisher=self.rng.choice(orgs).id)
        work.attrs.update(form=self.rng.choice(sorted(FORMS)),
                          begun=int(work.facts["work_year"]) - self.rng.randint(1, 9))
        if self.rng.random() < 0.4:
            work.attrs["alias"] = self.names.work()

    def employ(self, people: list[Entity], orgs: list[Entity]) -> None:
        """Give every person an employer, preferring organisations already founded then."""
        for person in people:
            joined = int(person.attrs["joined"])
            open_orgs = [o for o in orgs if int(o.facts["org_founded"]) <= joined
                         and o.facts["founder"] != person.id]
            person.facts["employer"] = self.rng.choice(open_orgs or orgs).id


def build_entities(rng: random.Random, num_people: int, num_cities: int, num_orgs: int,
                   num_works: int, distractor_ratio: float) -> World:
    """Draw a whole world; the same RNG state always yields the same world."""
    b = _Builder(rng, distractor_ratio)
    cities = b.population("city", num_cities, b.names.city, b.fill_city)
    people = b.population("person", num_people, lambda: b.names.person(b.first_names),
                          lambda p: b.fill_person(p, cities))
    orgs = b.population("org", num_orgs, b.names.org, lambda o: b.fill_org(o, people, cities))
    b.employ(people, orgs)
    b.population("work", num_works, b.names.work,
                 lambda w: b.fill_work(w, people, cities, orgs))
    return World(b.entities)
