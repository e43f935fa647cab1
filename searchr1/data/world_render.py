"""Render world entities as wiki-style corpus passages, one passage per section.

Each entity gets several passages (a person: early life, career, later life), each headed by
the entity's name as title, so its facts are spread out and a search must hit the right
section. Every section has several phrasings, chosen per entity, plus noise (other people,
other years, a parent's trade) that a careless reader could mistake for the answer.
"""

from __future__ import annotations

import random

from searchr1.data.types import Passage
from searchr1.data.world_entities import Entity, World
from searchr1.data.world_relations import SECTIONS

# Phrasings per (kind, section); every fact of the section appears in every phrasing, so
# any phrasing answers the same questions. Fields: {n} full name, {s} short name (a person's
# surname), {he}/{his}/{him} pronouns, {a_x} = "a"/"an" + x, facts by relation name.
TEMPLATES: dict[tuple[str, str], tuple[str, ...]] = {
    # Birth year, birth city and profession; the parent's trade is a decoy profession.
    ("person", "Early life"): (
        "{n} was born in {born_in} in {born_year}, the child of {a_parent_job}. "
        "{s} was {a_profession} by profession.",
        "Born in {born_year} in {born_in}, {n} grew up in a family of modest means; {his} mother "
        "was {a_parent_job}. By profession {he} was {a_profession}.",
        "{n} ({born_year}) was {a_profession} by profession. {He} was born in {born_in}, where "
        "{his} father worked as {a_parent_job}.",
        "A native of {born_in}, {n} was born there in {born_year}. Although {his} family expected "
        "{him} to become {a_parent_job}, {s} was {a_profession} by profession.",
    ),
    # The employer; the year joined is a decoy year and {other} a decoy person.
    ("person", "Career"): (
        "{n} joined {employer} in {joined} and stayed there for most of {his} working life. "
        "{His} closest collaborator was {other}.",
        "In {joined}, {s} was hired by {employer}, where {he} spent the rest of {his} career.",
        "{s} worked at {employer}, which {he} joined in {joined}, for most of {his} career. "
        "Colleagues there included {other}.",
        "From {joined} onward {n} worked for {employer}; {his} career there lasted several "
        "decades.",
    ),
    # Place of death; the death year is never asked, so it is one more decoy year.
    ("person", "Later life"): (
        "{n} died in {died_in} in {died_year}.",
        "{s} spent {his} final years in {died_in}, where {he} died in {died_year}.",
        "After retiring, {n} moved to {died_in} and died there in {died_year}. {He} was a close "
        "friend of {other}.",
        "{s} died in {died_year} in {died_in}, survived by a wide circle of friends that "
        "included {other}.",
    ),
    # Founder and founding year; some phrasings add a decoy reorganisation year.
    ("org", "History"): (
        "{n} was founded in {org_founded} by {founder}. It was reorganised in {renamed}.",
        "In {org_founded}, {founder} founded {n} in a small rented workshop.",
        "{founder} established {n} in {org_founded}; the founding charter still hangs in its "
        "lobby.",
        "The origins of {n} go back to {org_founded}, when it was founded by {founder}. A major "
        "reorganisation followed in {renamed}.",
    ),
    # Headquarters city and industry (used in descriptions); the former name is appended.
    ("org", "Operations"): (
        "{n} is {a_industry} company headquartered in {hq}. It employs about {staff} people.",
        "The headquarters of {n}, {a_industry} firm, are located in {hq}.",
        "{n} has its headquarters in {hq} and works mainly in {industry}, with a staff of "
        "roughly {staff}.",
    ),
    # Creator and form; {begun} is a decoy year, {place} a decoy city.
    ("work", "Background"): (
        "{n} is {a_form} by {creator}, who began work on it in {begun}. It draws on the history "
        "of {place}.",
        "{creator} {made} the {form} {n}, begun in {begun}.",
        "{n} is {a_form} {made_pp} by {creator}. Its subject is the old quarter of {place}.",
        "The {form} {n} was {made_pp} by {creator} over several years, starting in {begun}.",
    ),
    # Year, city and organisation of the first showing; the alternative title is appended.
    ("work", "Release"): (
        "{n} was first {shown} in {premiere} in {work_year} by {publisher}.",
        "{publisher} first {staged} {n} in {work_year}; the first {show_noun} took place in "
        "{premiere}.",
        "The first {show_noun} of {n} took place in {premiere} in {work_year}, organised by "
        "{publisher}.",
    ),
    # Province and river; the population is noise.
    ("city", "Geography"): (
        "{n} is a city in the province of {region}, on the banks of the {river} river. It has "
        "about {population} inhabitants.",
        "{n} lies on the {river} River in {region} Province.",
        "Situated in the province of {region}, {n} is crossed by the river {river}; about "
        "{population} people live there.",
    ),
    # Founding year; the charter year is a decoy.
    ("city", "History"): (
        "{n} was founded in {city_founded} and received its town charter in {charter}.",
        "Records show that {n} was founded in {city_founded}; it was granted a charter in "
        "{charter}.",
        "The settlement that became {n} was founded in {city_founded} as a river crossing.",
        "Founded in {city_founded}, {n} had grown into a market town by {charter}.",
    ),
}
# Sentences that state an entity's other name, appended to the section that holds it.
ALIAS_TEMPLATES: dict[tuple[str, str], tuple[str, ...]] = {
    ("org", "Operations"): ("It was formerly known as {alias}.",
                            "Until {renamed} the company traded as {alias}.",
                            "The firm was originally called {alias}."),
    ("work", "Release"): ("It is also known as {alias}.", "Some editions carry the title {alias}.",
                          "It was later reissued under the title {alias}."),
}


def article(word: str) -> str:
    """``word`` with its indefinite article ("an engineer", "a violinist")."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _fields(world: World, entity: Entity, people: list[Entity], cities: list[Entity],
            rng: random.Random) -> dict[str, str]:
    """Template fields for one entity, with pronouns, articles and random noise names.

    ``other`` (a colleague or friend) and ``place`` (a work's setting) name unrelated
    entities, so the name of a person or city appearing in a passage is no proof of a fact.
    """
    fields = world.fields(entity)
    he = fields.get("he", "it")
    short = entity.name.split()[-1] if entity.kind == "person" else entity.name
    fields.update(n=entity.name, s=short,
                  he=he, He=he.capitalize(), him={"he": "him", "she": "her"}.get(he, "it"),
                  His=fields.get("his", "its").capitalize())
    fields["other"] = rng.choice([p for p in people if p.id != entity.id]).name
    fields["place"] = rng.choice(cities).name
    for key in ("profession", "parent_job", "industry", "form"):
        if key in fields:
            fields[f"a_{key}"] = article(fields[key])
    return fields


def render_section(kind: str, section: str, fields: dict[str, str], rng: random.Random) -> str:
    """The body of one section passage: one phrasing, plus the alias sentence if any."""
    body = rng.choice(TEMPLATES[(kind, section)]).format(**fields)
    if "alias" in fields and (kind, section) in ALIAS_TEMPLATES:
        body += " " + rng.choice(ALIAS_TEMPLATES[(kind, section)]).format(**fields)
    return body


def render_corpus(world: World,
                  rng: random.Random) -> tuple[list[Passage], dict[tuple[str, str], str]]:
    """All passages, and the passage id of each (entity id, section).

    Passage ids are sequential strings ("0", "1", …) like the Search-R1 corpora.
    """
    passages: list[Passage] = []
    section_ids: dict[tuple[str, str], str] = {}
    people, cities = world.of_kind("person"), world.of_kind("city")
    for entity in world.entities.values():
        fields = _fields(world, entity, people, cities, rng)
        for section in SECTIONS[entity.kind]:
            pid = str(len(passages))
            body = render_section(entity.kind, section, fields, rng)
            passages.append(Passage(pid, f'"{entity.name}"\n{body}'))
            section_ids[(entity.id, section)] = pid
    return passages, section_ids
