"""The schema of the generated world: entity kinds, relations and question phrasings.

Everything here is immutable data. A ``Relation`` is a functional fact (one value per
subject), lives in exactly one passage section, and carries several phrasings: questions
about it (``ask``), noun phrases that name its value inside a longer question (``np``, for
multi-hop chains such as "the birthplace of the founder of X"), and the query an oracle
would search with. Templates are ``str.format`` strings over ``{x}`` (the subject as named in
the question) plus the hop entity's fields (``{form}``, ``{made}``, ``{shown}`` … for works).
"""

from __future__ import annotations

from dataclasses import dataclass

ENTITY_KINDS = ("person", "city", "org", "work")
# Passage sections per entity kind; each becomes its own passage with the title repeated.
SECTIONS = {
    "person": ("Early life", "Career", "Later life"),
    "org": ("History", "Operations"),
    "work": ("Background", "Release"),
    "city": ("Geography", "History"),
}


@dataclass(frozen=True)
class Relation:
    """One functional fact type: ``src`` entity → ``dst`` entity kind or literal kind."""

    name: str
    src: str
    dst: str
    section: str
    query: str
    ask: tuple[str, ...]
    np: tuple[str, ...] = ()

    @property
    def to_entity(self) -> bool:
        """Whether the value is another entity (so a chain can continue through it)."""
        return self.dst in ENTITY_KINDS


# The oracle ``query`` uses the words the passage phrasings share ("born", "founded",
# "headquarters"), so a search with the real name finds the right section passage.
RELATIONS: tuple[Relation, ...] = (
    # People: birth and profession in "Early life", employer in "Career", death in "Later life".
    Relation("born_year", "person", "year", "Early life", "when was {x} born",
             ("In what year was {x} born?", "When was {x} born?",
              "What is the birth year of {x}?", "{x} was born in which year?")),
    Relation("born_in", "person", "city", "Early life", "where was {x} born",
             ("In which city was {x} born?", "Where was {x} born?",
              "What is the birthplace of {x}?", "Which city is {x} a native of?"),
             ("the birthplace of {x}", "the city where {x} was born", "the hometown of {x}")),
    Relation("profession", "person", "profession", "Early life", "{x} profession",
             ("What was the profession of {x}?", "What did {x} do for a living?",
              "What was the occupation of {x}?", "{x} worked in which profession?")),
    Relation("employer", "person", "org", "Career", "where did {x} work",
             ("Which organisation employed {x}?", "For which company did {x} work?",
              "Who was the employer of {x}?", "At which company did {x} spend most of a career?"),
             ("the employer of {x}", "the organisation that employed {x}",
              "the company {x} worked for")),
    Relation("died_in", "person", "city", "Later life", "where did {x} die",
             ("Where did {x} die?", "In which city did {x} die?",
              "What was the place of death of {x}?",
              "{x} spent the final years of life in which city?"),
             ("the city where {x} died", "the place of death of {x}",
              "the city in which {x} spent the final years")),
    # Organisations: founder and year in "History", headquarters in "Operations".
    Relation("founder", "org", "person", "History", "who founded {x}",
             ("Who founded {x}?", "Who was the founder of {x}?", "By whom was {x} founded?",
              "Which person established {x}?"),
             ("the founder of {x}", "the person who founded {x}",
              "the person who established {x}")),
    Relation("org_founded", "org", "year", "History", "when was {x} founded",
             ("When was {x} founded?", "In what year was {x} founded?",
              "What is the founding year of {x}?", "{x} was established in which year?")),
    Relation("hq", "org", "city", "Operations", "{x} headquarters",
             ("Where is {x} headquartered?", "In which city are the headquarters of {x}?",
              "Which city is home to the headquarters of {x}?",
              "{x} has its head office in which city?"),
             ("the headquarters city of {x}", "the city where {x} is headquartered",
              "the home city of {x}")),
    # Works: creator in "Background"; the first showing (year, city, organisation) in
    # "Release". Verbs follow the work's form: a novel is written and published.
    Relation("creator", "work", "person", "Background", "who {made} {x}",
             ("Who {made} {x}?", "Who is the {agent} of {x}?", "Who created {x}?",
              "{x} was {made_pp} by whom?"),
             ("the {agent} of {x}", "the creator of {x}", "the person who {made} {x}")),
    Relation("work_year", "work", "year", "Release", "when was {x} first {shown}",
             ("When was {x} first {shown}?", "In what year was {x} first {shown}?",
              "What year did {x} first appear?", "{x} was first {shown} in which year?")),
    Relation("premiere", "work", "city", "Release", "where was {x} first {shown}",
             ("Where was {x} first {shown}?", "In which city was {x} first {shown}?",
              "Which city saw the first {show_noun} of {x}?"),
             ("the city where {x} was first {shown}", "the place of the first {show_noun} of {x}",
              "the city that hosted the first {show_noun} of {x}")),
    Relation("publisher", "work", "org", "Release", "who {staged} {x}",
             ("Which company first {staged} {x}?", "Which organisation {staged} {x}?",
              "Who was responsible for the first {show_noun} of {x}?"),
             ("the company that first {staged} {x}",
              "the organisation behind the first {show_noun} of {x}",
              "the firm that {staged} {x}")),
    # Cities: province and river in "Geography", founding year in "History".
    Relation("region", "city", "region", "Geography", "{x} province",
             ("In which province is {x}?", "Which province is {x} located in?",
              "{x} lies in which province?", "What province contains {x}?")),
    Relation("river", "city", "river", "Geography", "{x} river",
             ("Which river flows through {x}?", "On which river does {x} lie?",
              "What river crosses {x}?")),
    Relation("city_founded", "city", "year", "History", "when was {x} founded",
             ("When was {x} founded?", "In what year was {x} founded?",
              "What is the founding year of {x}?")),
)
RELATION_BY_NAME = {relation.name: relation for relation in RELATIONS}


@dataclass(frozen=True)
class Form:
    """How a kind of creative work is made and shown, for form-aware phrasing."""

    agent: str
    made: str
    made_pp: str
    shown: str
    show_noun: str
    staged: str


# The verbs and nouns of each form, e.g. "Who composed X?", "the first staging of X".
FORMS = {
    "novel": Form("author", "wrote", "written", "published", "publication", "published"),
    "symphony": Form("composer", "composed", "composed", "performed", "performance", "performed"),
    "painting": Form("painter", "painted", "painted", "exhibited", "exhibition", "exhibited"),
    "film": Form("director", "directed", "directed", "screened", "screening", "distributed"),
    "opera": Form("composer", "composed", "composed", "staged", "staging", "staged"),
    "poem cycle": Form("poet", "wrote", "written", "published", "publication", "published"),
}


@dataclass(frozen=True)
class Referral:
    """Ways to name an entity without its name: a unique description, or a former name.

    ``key`` lists the facts that must single the entity out for the description to be used;
    both the description and the alias are stated in ``section`` only, so the question's
    own words find that passage, and an oracle then searches again with the real name.
    """

    section: str
    key: tuple[str, ...]
    describe: tuple[str, ...]
    query: str
    alias: tuple[str, ...] = ()


# Descriptions use facts of one section only, so a search with the description itself finds
# the passage that reveals the name; ``key`` facts must be unique for it to be used.
REFERRALS = {
    "person": Referral(
        "Early life", ("born_in", "born_year"),
        ("the {profession} born in {born_in} in {born_year}",
         "the person who was born in {born_in} in {born_year}",
         "the {profession} born in {born_year} in {born_in}"),
        "{profession} born {born_in} {born_year}"),
    "org": Referral(
        "Operations", ("industry", "hq"),
        ("the {industry} company headquartered in {hq}", "the {industry} firm based in {hq}",
         "the {industry} business whose headquarters are in {hq}"),
        "{industry} headquarters {hq}",
        ("the company formerly known as {alias}", "the organisation once called {alias}",
         "the firm that used to trade as {alias}")),
    "work": Referral(
        "Release", ("form", "premiere", "work_year"),
        ("the {form} first {shown} in {premiere} in {work_year}",
         "the {work_year} {form} first {shown} in {premiere}",
         "the {form} whose first {show_noun} took place in {premiere} in {work_year}"),
        "{form} {shown} {premiere} {work_year}",
        ("the {form} also known as {alias}", "the {form} sometimes titled {alias}",
         "the {form} issued under the title {alias}")),
    "city": Referral(
        "Geography", ("region", "river"),
        ("the city on the {river} in the province of {region}",
         "the {region} city on the {river}", "the city of {region} that lies on the {river}"),
        "{region} {river}"),
}


@dataclass(frozen=True)
class Comparison:
    """A "which came first" question over one year-valued relation of a kind."""

    relation: str
    earlier: tuple[str, ...]
    later: tuple[str, ...]


# "earlier" phrasings ask for the smaller year, "later" phrasings for the larger one.
COMPARISONS = {
    "person": Comparison(
        "born_year",
        ("Who was born earlier, {a} or {b}?", "Who is older, {a} or {b}?",
         "Which of the two was born first: {a} or {b}?"),
        ("Who was born later, {a} or {b}?", "Who is younger, {a} or {b}?")),
    "org": Comparison(
        "org_founded",
        ("Which was founded first, {a} or {b}?", "Which organisation is older, {a} or {b}?",
         "Which was established earlier: {a} or {b}?"),
        ("Which was founded more recently, {a} or {b}?",
         "Which organisation is younger, {a} or {b}?")),
    "work": Comparison(
        "work_year",
        ("Which came out first, {a} or {b}?", "Which is older, {a} or {b}?",
         "Which appeared earlier: {a} or {b}?"),
        ("Which is the more recent work, {a} or {b}?", "Which appeared later: {a} or {b}?")),
    "city": Comparison(
        "city_founded",
        ("Which city was founded first, {a} or {b}?", "Which is the older city, {a} or {b}?",
         "Which city is older: {a} or {b}?"),
        ("Which city is younger, {a} or {b}?",
         "Which city was founded more recently, {a} or {b}?")),
}


def chains(length: int) -> list[tuple[Relation, ...]]:
    """Every relation path of ``length`` hops whose inner values are entities.

    The chain starts at a named subject; each hop but the last must lead to an entity
    so the next relation has something to apply to.
    """
    paths: list[tuple[Relation, ...]] = [(r,) for r in RELATIONS]
    for _ in range(length - 1):
        paths = [p + (r,) for p in paths if p[-1].to_entity for r in RELATIONS
                 if r.src == p[-1].dst]
    return paths
