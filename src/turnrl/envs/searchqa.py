"""Multi-hop question answering over a seeded corpus of fictional entities, with search and open tools.

Corpus (seeded). Each seed invents ``num_people`` people, ``num_orgs`` organisations and ``num_towns``
towns with syllable-built names (``Velmara Oskit``, ``Durnhollow``), so no answer can be memorised, and
links them: a person was born in a town, works for an organisation and has a profession; an organisation
was founded by a person and has its headquarters in a town; a river flows through each town, which lies in a
region. One document per entity states these facts in sentences; document ids are ``d00``, ``d01``, ...

Question (seeded), one of three templates with ``hops`` documents to read (the difficulty; 2 by default), each
starting from a person's document:

- 1 hop: "In which town was P born?", "Which organisation does P work for?", "What is the profession of P?";
- 2 hops: "In which town is the headquarters of the organisation that P works for?" (person -> organisation);
  "Who founded the organisation that P works for?" (person -> organisation; never asked when P founded it);
  "Which river flows through the town where P was born?" (person -> town);
- 3 hops: "Which river flows through the town where the organisation that P works for has its headquarters?" and
  "In which region is ...?" (person -> organisation -> town); "In which town was the founder of the organisation
  that P works for born?" (person -> organisation -> founder; never asked when P founded it).

Tools (see :class:`~turnrl.envs.tools.env.ToolEnv` for the call format and errors):

- ``search(query)``: the ``top_k`` documents by BM25 (Robertson et al., k1=1.5, b=0.75, Lucene's
  non-negative idf ``log(1 + (N - df + 0.5) / (df + 0.5))``; tokens are lower-cased ``\\w+`` runs; ties by id),
  each as its id, title and first sentence;
- ``open(doc_id)``: the full text of a document;
- ``answer(answer)``: the final answer; ends the episode.

Reward (on ``answer``): ``exact_match`` and ``f1`` are separate named components, with SQuAD's answer
normalisation (lower case, no punctuation, no articles, single spaces) and token F1. The reward is their
mean: components ``exact_match = em_weight * EM`` and ``f1 = (1 - em_weight) * F1`` with ``em_weight=0.5``,
so an exact answer earns 1.0 and a partly right one (``Durn`` for ``Durn Hollow``) earns part of the F1 half.
Success means EM = 1. The oracle searches the person's name, opens the ``hops`` documents of the question's path
(the person's first) and answers.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import string
from collections import Counter
from dataclasses import dataclass

from turnrl.envs.tools import Tool, ToolCall, ToolEnv, ToolError, Verdict, make_tool

_TOKEN = re.compile(r"\w+")
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st", "th", "sh", "gl"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "sk", "m"]
_PROFESSIONS = ["cartographer", "glassblower", "archivist", "beekeeper", "clockmaker", "ferry pilot", "botanist", "weaver"]
_ORG_KINDS = ["guild", "trading house", "observatory", "shipyard", "press", "brewery", "foundry", "academy"]
_TOWN_SUFFIXES = ["hollow", "mere", "ford", "wick", "stead", "haven", "moor", "crest"]
_REGIONS = ["northern", "southern", "eastern", "western", "central"]
QUESTION_KINDS = ("headquarters", "founder", "river")  # the 2-hop templates
KINDS = {1: ("born", "employer", "profession"), 2: QUESTION_KINDS,
         3: ("headquarters_river", "headquarters_region", "founder_born")}
_NUMBERS = {1: "one", 2: "two", 3: "three"}


@dataclass
class Doc:
    """One corpus document."""

    doc_id: str
    title: str
    text: str


def tokenize(text: str) -> list[str]:
    """Lower-cased ``\\w+`` runs."""
    return _TOKEN.findall(text.lower())


class BM25:
    """Okapi BM25 over tokenised documents (see the module docstring for the exact variant)."""

    def __init__(self, docs: list[list[str]], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.tfs = [Counter(d) for d in docs]
        self.lens = [len(d) for d in docs]
        self.avg_len = sum(self.lens) / max(1, len(docs))
        df = Counter(t for d in docs for t in set(d))
        n = len(docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: list[str]) -> list[float]:
        """The score of every document for ``query`` (tokens)."""
        out = []
        for tf, length in zip(self.tfs, self.lens):
            s = 0.0
            for t in query:
                f = tf.get(t, 0)
                if f:
                    s += self.idf[t] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * length / self.avg_len))
            out.append(s)
        return out

    def top(self, query: list[str], k: int) -> list[int]:
        """Indices of the ``k`` best documents with a positive score, best first (ties by index)."""
        scores = self.scores(query)
        ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        return ranked[:k]


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, drop punctuation and the articles a/an/the, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD's token F1 between the normalised answers (0 when either is empty and they differ)."""
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


@dataclass
class World:
    """A generated corpus and one question over it."""

    docs: list[Doc]
    question: str
    answer: str
    path: list[str]  # the documents the question needs, in the order they lead to the answer (the person's first)
    person: str

    @property
    def person_doc(self) -> str:
        return self.path[0]

    @property
    def bridge_doc(self) -> str:
        """The second document of the path (2- and 3-hop questions)."""
        return self.path[1]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).capitalize()


def _unique(rng: random.Random, used: set[str], make) -> str:
    while True:
        name = make()
        if name not in used and name.lower() not in {"the", "a", "an"}:
            used.add(name)
            return name


def generate_world(rng: random.Random, num_people: int = 8, num_orgs: int = 4, num_towns: int = 4, hops: int = 2) -> World:
    """A seeded corpus of fictional people, organisations and towns, and one ``hops``-hop question over it."""
    used: set[str] = set()
    towns = [_unique(rng, used, lambda: _word(rng, 1) + rng.choice(_TOWN_SUFFIXES)) for _ in range(num_towns)]
    rivers = [_unique(rng, used, lambda: _word(rng, 2)) for _ in range(num_towns)]
    people = [_unique(rng, used, lambda: f"{_word(rng, 2)} {_word(rng, 2)}") for _ in range(num_people)]
    orgs = [_unique(rng, used, lambda: f"{_word(rng, 2)} {rng.choice(_ORG_KINDS).title()}") for _ in range(num_orgs)]
    born = {p: rng.choice(towns) for p in people}
    works = {p: rng.choice(orgs) for p in people}
    job = {p: rng.choice(_PROFESSIONS) for p in people}
    founder = {o: rng.choice(people) for o in orgs}
    hq = {o: rng.choice(towns) for o in orgs}
    river = dict(zip(towns, rivers))
    region = {t: rng.choice(_REGIONS) for t in towns}
    entities: list[tuple[str, str]] = []
    for p in people:
        founded = [o for o in orgs if founder[o] == p]
        extra = f" {p} founded the {' and the '.join(founded)}." if founded else ""
        entities.append((p, f"{p} is {_article(job[p])} {job[p]} born in {born[p]}. {p} works for the {works[p]}.{extra}"))
    for o in orgs:
        entities.append((o, f"The {o} was founded by {founder[o]}. The headquarters of the {o} are in {hq[o]}."))
    for t in towns:
        entities.append((t, f"{t} is a town in the {region[t]} region. The {river[t]} river flows through {t}."))
    order = list(range(len(entities)))
    rng.shuffle(order)
    docs = [Doc(f"d{i:02d}", entities[j][0], entities[j][1]) for i, j in enumerate(order)]
    doc_of = {d.title: d.doc_id for d in docs}
    person = rng.choice(people)
    kind = rng.choice(KINDS[hops])
    while kind in ("founder", "founder_born") and founder[works[person]] == person:  # the answer or a hop would be P's
        person, kind = rng.choice(people), rng.choice(KINDS[hops])
    org = works[person]
    of_org = f"the organisation that {person} works for"
    questions = {  # kind -> (question, answer, the entities after the person whose documents lead to the answer)
        "born": (f"In which town was {person} born?", born[person], []),
        "employer": (f"Which organisation does {person} work for?", org, []),
        "profession": (f"What is the profession of {person}?", job[person], []),
        "headquarters": (f"In which town is the headquarters of {of_org}?", hq[org], [org]),
        "founder": (f"Who founded {of_org}?", founder[org], [org]),
        "river": (f"Which river flows through the town where {person} was born?", river[born[person]], [born[person]]),
        "headquarters_river": (f"Which river flows through the town where {of_org} has its headquarters?",
                               river[hq[org]], [org, hq[org]]),
        "headquarters_region": (f"In which region is the town where {of_org} has its headquarters?", region[hq[org]],
                                [org, hq[org]]),
        "founder_born": (f"In which town was the founder of {of_org} born?", born[founder[org]], [org, founder[org]]),
    }
    question, answer, bridges = questions[kind]
    return World(docs, question, answer, [doc_of[person], *(doc_of[b] for b in bridges)], person)


class SearchQA(ToolEnv):
    """Answer a multi-hop question by searching and reading a seeded fictional corpus (see the module docstring).

    Args:
        num_people, num_orgs, num_towns: corpus size (one document per entity).
        hops: documents a question needs, 1 to 3 (the difficulty).
        top_k: how many results ``search`` lists.
        em_weight: the reward's weight on exact match; ``1 - em_weight`` goes to token F1.
        max_actions_per_turn, tool_timeout: see :class:`~turnrl.envs.tools.env.ToolEnv`.
    """

    task_description = (
        "Answer the question using the document collection. Search for the names in the question, open the "
        "documents you need (a question needs {docs}), then answer with just the name."
    )
    final_tools = ("answer",)
    reward_names = ("exact_match", "f1")

    def __init__(self, num_people: int = 8, num_orgs: int = 4, num_towns: int = 4, top_k: int = 3,
                 em_weight: float = 0.5, max_actions_per_turn: int = 1, tool_timeout: float = 2.0, hops: int = 2) -> None:
        if hops not in KINDS:
            raise ValueError(f"hops={hops} must be 1, 2 or 3 (documents a question needs)")
        if num_people < 2 or num_orgs < 1 or num_towns < 1:
            raise ValueError(f"need num_people >= 2, num_orgs >= 1, num_towns >= 1; got {num_people}, {num_orgs}, {num_towns}")
        if top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1")
        if not 0.0 <= em_weight <= 1.0:
            raise ValueError(f"em_weight={em_weight} must be in [0, 1]")
        self.sizes = (num_people, num_orgs, num_towns)
        self.top_k, self.em_weight, self.hops = top_k, em_weight, hops
        self.task_description = type(self).task_description.format(docs=_NUMBERS[hops])  # type: ignore[misc]
        self._rng = random.Random()
        self.world: World | None = None
        self._index: BM25 | None = None
        self._corpus = ""
        super().__init__(max_actions_per_turn=max_actions_per_turn, tool_timeout=tool_timeout)

    def build_tools(self) -> list[Tool]:
        def search(query: str) -> str:
            """Search the documents; lists the best matches with their first sentence.

            Args:
                query: words to look for, e.g. a name.
            """
            world, index = self._require_world()
            hits = index.top(tokenize(query), self.top_k)
            if not hits:
                return "No document matches. Search for a name from the question."
            return "\n".join(f"{world.docs[i].doc_id}: {world.docs[i].title}: {_first_sentence(world.docs[i].text)}" for i in hits)

        def open(doc_id: str) -> str:  # noqa: A001 - the tool's name as the model sees it
            """Read a whole document.

            Args:
                doc_id: a document id from the search results, e.g. "d03".
            """
            world, _ = self._require_world()
            for d in world.docs:
                if d.doc_id == doc_id.strip():
                    return f"{d.doc_id}: {d.title}\n{d.text}"
            raise ToolError(f"no document {doc_id!r}; ids run from d00 to d{len(world.docs) - 1:02d}")

        def answer(answer: str) -> str:
            """Give the final answer (just the name).

            Args:
                answer: the answer, e.g. "Durnhollow".
            """
            raise AssertionError("answer is judged by verify()")

        return [make_tool(search), make_tool(open), make_tool(answer)]

    def _require_world(self) -> tuple[World, BM25]:
        if self.world is None or self._index is None:
            raise ToolError("no task yet: the env must be reset first")
        return self.world, self._index

    def new_task(self, seed: int | None) -> None:
        if seed is not None:
            self._rng = random.Random(seed)
        self.world = generate_world(self._rng, *self.sizes, hops=self.hops)
        self._index = BM25([tokenize(d.title + " " + d.text) for d in self.world.docs])
        self._corpus = hashlib.sha1("\n".join(d.text for d in self.world.docs).encode()).hexdigest()[:12]

    def task_observation(self) -> str:
        assert self.world is not None
        return f"Question: {self.world.question}\nDocuments: {len(self.world.docs)} (ids d00-d{len(self.world.docs) - 1:02d})"

    def task_key(self) -> str:
        """The question and a digest of the corpus it is asked over: ``"Who founded ...? [corpus 3fa9c1d2e4b5]"``."""
        return f"{self.world.question} [corpus {self._corpus}]" if self.world else ""

    def verify(self, call: ToolCall) -> Verdict:
        assert self.world is not None
        prediction, gold = call.arguments["answer"], self.world.answer
        em, f1 = exact_match(prediction, gold), token_f1(prediction, gold)
        components = {"exact_match": self.em_weight * em, "f1": (1 - self.em_weight) * f1}
        message = "Correct." if em else f"Wrong: the answer is {gold} (token F1 {f1:.2f})."
        return Verdict(components, em == 1.0, message)

    def oracle_calls(self) -> list[ToolCall]:
        """Search the person's name, open the documents of the question's path in order, answer."""
        assert self.world is not None
        w = self.world
        return [ToolCall("search", {"query": w.person}), *(ToolCall("open", {"doc_id": d}) for d in w.path),
                ToolCall("answer", {"answer": w.answer})]

    def examples(self) -> list[tuple[str, str]]:
        """The oracle's turns on one fixed world (drawn from a string seed, never an int task seed)."""
        world = generate_world(random.Random("searchqa-examples"), *self.sizes, hops=self.hops)
        obs = f"Question: {world.question}\nDocuments: {len(world.docs)} (ids d00-d{len(world.docs) - 1:02d})"
        index = BM25([tokenize(d.title + " " + d.text) for d in world.docs])
        hits = index.top(tokenize(world.person), self.top_k)
        results = "\n".join(f"{world.docs[i].doc_id}: {world.docs[i].title}: {_first_sentence(world.docs[i].text)}" for i in hits)
        opened = [next(d for d in world.docs if d.doc_id == doc_id) for doc_id in world.path]
        observations = [obs, f'<tool_response name="search">\n{results}\n</tool_response>',
                        *(f'<tool_response name="open">\n{d.doc_id}: {d.title}\n{d.text}\n</tool_response>' for d in opened)]
        calls = [ToolCall("search", {"query": world.person}), *(ToolCall("open", {"doc_id": d}) for d in world.path),
                 ToolCall("answer", {"answer": world.answer})]
        return list(zip(observations, [c.to_text() for c in calls]))

    def render(self) -> str:
        if self.world is None:
            return "(not reset)"
        lines = [self.task_observation(), *(f"called {s}" for s in self.history)]
        if self.last_verdict is not None:
            lines.append(self.last_verdict.message)
        return "\n".join(lines)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _first_sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".") + "."
