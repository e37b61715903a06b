"""A synthetic corpus with facts that chain, and multi-hop questions over it.

BrowseComp-Plus style: a question names one entity and asks about another that is
only reachable through two or three documents (a product -> the company making it ->
its founder -> the founder's birthplace -> that city's region). Every name is made up
from syllables, so no model can answer from memory and the documents must be read.
The generator is seeded: the same seed writes the same corpus and questions.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

_SYL = (
    "ka",
    "lo",
    "mi",
    "ra",
    "ven",
    "dor",
    "sel",
    "tu",
    "bri",
    "na",
    "qua",
    "zen",
    "fa",
    "ol",
    "mar",
    "is",
    "eth",
    "gar",
)
_PRODUCTS = (
    "glass lenses",
    "sail cloth",
    "clock springs",
    "copper wire",
    "tide gauges",
    "paper kites",
    "ink pumps",
    "rope ladders",
    "salt crystals",
    "wind vanes",
    "brass valves",
    "seed drills",
    "felt hats",
    "lamp oil",
    "bell frames",
    "river barges",
    "chalk dust",
    "tin whistles",
    "wool dye",
    "map cases",
)


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str
    #: Documents that must be read, in order.
    hops: tuple[str, ...]


@dataclass(frozen=True)
class Corpus:
    documents: tuple[Document, ...]
    questions: tuple[Question, ...]

    def doc(self, doc_id: str) -> Document:
        for d in self.documents:
            if d.id == doc_id:
                return d
        raise KeyError(doc_id)

    def save(self, path: str | Path) -> None:
        """Write the corpus as JSON lines (one document or question per line)."""
        with open(path, "w") as f:
            for d in self.documents:
                f.write(json.dumps({"type": "document", **asdict(d)}) + "\n")
            for q in self.questions:
                f.write(json.dumps({"type": "question", **asdict(q)}) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Corpus:
        docs, qs = [], []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            row = json.loads(line)
            kind = row.pop("type", None)
            if kind == "document":
                docs.append(Document(**row))
            elif kind == "question":
                qs.append(Question(**{**row, "hops": tuple(row["hops"])}))
            else:
                raise ValueError(f"{path}:{n}: unknown record type {kind!r}")
        return cls(tuple(docs), tuple(qs))


def _names(rng: random.Random, n: int, parts: int, used: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = "".join(rng.choice(_SYL) for _ in range(parts)).capitalize()
        if name not in used:
            used.add(name)
            out.append(name)
    return out


def generate_corpus(
    seed: int = 0, *, regions: int = 6, cities: int = 24, people: int = 50, companies: int = 20, questions: int = 40
) -> Corpus:
    """About ``regions + cities + people + companies`` documents (100 by default)."""
    if companies > len(_PRODUCTS):
        raise ValueError(f"at most {len(_PRODUCTS)} companies (one product each), got {companies}")
    rng = random.Random(seed)
    used: set[str] = set()
    region_names = _names(rng, regions, 2, used)
    city_names = _names(rng, cities, 3, used)
    firsts, lasts = _names(rng, people, 2, used), _names(rng, people, 3, used)
    person_names = [f"{a} {b}" for a, b in zip(firsts, lasts, strict=True)]
    company_names = [f"{n} Works" for n in _names(rng, companies, 2, used)]
    products = rng.sample(_PRODUCTS, companies)

    city_region = {c: rng.choice(region_names) for c in city_names}
    birth = {p: rng.choice(city_names) for p in person_names}
    founders = rng.sample(person_names, companies)
    company = {
        c: {"founder": f, "product": prod, "hq": rng.choice(city_names), "year": rng.randint(1780, 1960)}
        for c, f, prod in zip(company_names, founders, products, strict=True)
    }
    docs: list[Document] = []
    ids: dict[str, str] = {}

    def add(title: str, text: str) -> None:
        ids[title] = f"d{len(docs):03d}"
        docs.append(Document(ids[title], title, text))

    for r in region_names:
        members = sorted(c for c in city_names if city_region[c] == r)
        listed = ", ".join(members) if members else "no large towns"
        add(r, f"{r} is an inland region. Its towns include {listed}. The region is known for its long winters.")
    for c in city_names:
        add(
            c,
            f"{c} is a town in the region of {city_region[c]}. It holds a market every {rng.choice(['spring', 'autumn', 'week'])}.",
        )
    for p in person_names:
        trade = rng.choice(["an engineer", "a merchant", "a chemist", "a surveyor", "a weaver"])
        add(p, f"{p} was {trade}. {p.split()[0]} was born in the town of {birth[p]} and later moved often.")
    for c, info in company.items():
        add(
            c,
            f"{c} makes {info['product']}. The company was founded in {info['year']} by {info['founder']}. "
            f"Its workshop stands in {info['hq']}.",
        )

    qs: list[Question] = []
    names = list(company)
    for i in range(questions):
        c = names[i % len(names)]
        info = company[c]
        f = info["founder"]
        kind = (i // len(names)) % 2
        if kind == 0:
            q = f"In which town was the founder of the company that makes {info['product']} born?"
            qs.append(Question(f"q{i:03d}", q, birth[f], (ids[c], ids[f])))
        else:
            q = f"The company that makes {info['product']} was founded by someone born in a town. Which region is that town in?"
            qs.append(Question(f"q{i:03d}", q, city_region[birth[f]], (ids[c], ids[f], ids[birth[f]])))
    return Corpus(tuple(docs), tuple(qs))
