"""WebShop as text: find and buy the product an instruction asks for in a simulated shop.

After WebShop (Yao et al. 2022, "WebShop: Towards Scalable Real-World Web Interaction with Grounded
Language Agents"), scaled down to a seeded, self-contained simulation: no real catalogue, no browser.

Task. Each seed builds a catalogue (``num_products`` products over six categories; each product has a
type such as ``running shoes``, a set of attributes such as ``non slip``, option values per option kind
such as ``size: 8, 9, 10`` and ``color: navy, black``, and a price) and picks a goal product, from which the
instruction is written: "i need running shoes that are non slip and lightweight, with size: 9 and color:
navy, and price lower than 50.00 dollars". The catalogue always holds distractors: products of the goal's
type with only some of the attributes, without the asked option, or over the price.

Pages and actions (one action per turn; the last ``search[...]``/``click[...]`` in the text counts, and
only the last ``<answer>...</answer>`` tag is read when there is one):

- search page: ``search[query]``;
- results page (``page_size`` results a page, ranked by how many query words a product's type, title,
  attributes and category contain; ties keep catalogue order): ``click[Back to Search]``, ``click[< Prev]``,
  ``click[Next >]``, ``click[<product id>]``;
- product page (title, price, options): ``click[<option value>]`` selects it for its kind,
  ``click[Description]``, ``click[< Prev]`` (back to the results), ``click[Back to Search]``, ``click[Buy Now]``;
- description page (description and features): ``click[< Prev]``, ``click[Back to Search]``.

An action not available on the current page is invalid: the state stays, the observation says why and
lists the available actions. Button text matches case-insensitively.

Reward, when buying (``Buy Now`` terminates the episode), as WebShop's: with U the instruction's
attributes and options, Y the bought product's attributes and selected options,

    r = r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[price <= limit]) / (|U_att| + |U_opt| + 1)

where ``r_type`` is 1 for the asked product type, 0.5 for another type of the same category and 0.1
otherwise (WebShop scores type by text matching of titles and categories; here the type is explicit).
Named components: ``attributes``, ``options``, ``price`` (each term over the denominator) and ``type``
(``(r_type - 1)`` times their sum), which add up to ``r``. Success means ``r == 1``. Other turns pay 0.
Not simulated: WebShop's real product texts, fuzzy attribute matching, reviews and the 1.18M-product index.
"""

from __future__ import annotations

import math
import random
import re
import string
from dataclasses import dataclass, field, replace
from typing import Any

from turnrl.envs.base import Env

# category -> (product types, attributes, {option kind: values}); option values are distinct across kinds of a category
CATEGORIES: dict[str, tuple[list[str], list[str], dict[str, list[str]]]] = {
    "clothing": (["t-shirt", "hoodie", "jeans", "dress", "jacket"],
                 ["cotton", "machine washable", "slim fit", "long sleeve", "relaxed fit", "quick dry", "polyester", "button down"],
                 {"size": ["xs", "small", "medium", "large", "x-large"], "color": ["black", "white", "navy", "red", "grey", "green"]}),
    "shoes": (["running shoes", "sneakers", "boots", "sandals"],
              ["non slip", "waterproof", "lightweight", "leather", "memory foam", "breathable", "rubber sole", "arch support"],
              {"size": ["6", "7", "8", "9", "10", "11"], "color": ["black", "white", "navy", "brown", "pink"]}),
    "beauty": (["shampoo", "face cream", "lip balm", "sunscreen"],
               ["paraben free", "vegan", "fragrance free", "organic", "long lasting", "sensitive skin", "cruelty free", "travel size"],
               {"size": ["1 oz", "3.4 oz", "8 oz", "16 oz"], "scent": ["lavender", "unscented", "citrus", "coconut"]}),
    "grocery": (["coffee", "green tea", "protein bar", "trail mix"],
                ["gluten free", "sugar free", "non gmo", "low calorie", "keto friendly", "kosher", "high protein", "caffeine free"],
                {"flavor": ["original", "chocolate", "vanilla", "caramel", "mint"], "pack": ["1 pack", "6 pack", "12 pack"]}),
    "electronics": (["phone case", "usb cable", "wireless earbuds", "power bank"],
                    ["fast charging", "shockproof", "bluetooth", "compact", "noise cancelling", "durable", "water resistant", "usb c"],
                    {"color": ["black", "white", "blue", "silver"], "length": ["3 ft", "6 ft", "10 ft"]}),
    "home": (["bath towel", "throw pillow", "bed sheets", "curtains"],
             ["machine washable", "easy clean", "blackout", "soft", "hypoallergenic", "quick dry", "wrinkle free", "eco friendly"],
             {"size": ["twin", "full", "queen", "king"], "color": ["beige", "grey", "white", "navy", "sage"]}),
}
BRANDS = ["Zenko", "Aurel", "Maple & Co", "Northpeak", "Lumio", "Vantra", "Kessel", "Orbia", "Pellan", "Quill", "Rovo", "Sable"]
SEARCH, RESULTS, ITEM, DESCRIPTION = "search", "results", "item", "description"
BACK, PREV, NEXT, DESC, BUY = "Back to Search", "< Prev", "Next >", "Description", "Buy Now"
_ACTION = re.compile(r"\b(search|click)\s*\[([^\[\]]*)\]", re.IGNORECASE)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Product:
    asin: str
    category: str
    type: str
    title: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    """Option kind -> the values on offer (a kind may be absent)."""
    price: float
    description: str

    @property
    def words(self) -> set[str]:
        """What search matches: words of the title, type, attributes and category."""
        return set(_WORD.findall(f"{self.title} {self.type} {' '.join(self.attributes)} {self.category}".lower()))


@dataclass(frozen=True)
class Goal:
    """What the instruction asks for; ``asin`` is the product it was written from (the oracle buys it)."""

    asin: str
    category: str
    type: str
    attributes: tuple[str, ...]
    options: dict[str, str]
    price_limit: float

    @property
    def text(self) -> str:
        verb = "are" if self.type.endswith("s") else "is"
        article = "" if self.type.endswith("s") else ("an " if self.type[0] in "aeiou" else "a ")
        opts = " and ".join(f"{k}: {v}" for k, v in self.options.items())
        return (f"i need {article}{self.type} that {verb} {' and '.join(self.attributes)}, with {opts}, "
                f"and price lower than {self.price_limit:.2f} dollars")


@dataclass(frozen=True)
class View:
    """Where the agent is: the page, the search, the results page number, the product, the chosen options."""

    page: str = SEARCH
    query: str = ""
    page_no: int = 0
    asin: str = ""
    selected: tuple[tuple[str, str], ...] = ()

    def chosen(self) -> dict[str, str]:
        return dict(self.selected)


@dataclass
class Shop:
    catalogue: list[Product]
    goal: Goal
    by_asin: dict[str, Product] = field(init=False)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: p for p in self.catalogue}

    def search(self, query: str) -> list[Product]:
        """Products sharing at least one word with ``query``, most shared words first, ties in catalogue order."""
        words = set(_WORD.findall(query.lower()))
        scored = [(-len(words & p.words), i, p) for i, p in enumerate(self.catalogue)]
        return [p for score, _, p in sorted(scored, key=lambda t: t[:2]) if score < 0][:50]


def _asin(rng: random.Random) -> str:
    return "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))


def _product(rng: random.Random, category: str, ptype: str, attributes: list[str], options: dict[str, tuple[str, ...]], price: float) -> Product:
    brand = rng.choice(BRANDS)
    shown = [a for a in attributes if rng.random() < 0.6]
    title = f"{brand} {' '.join(a.title() for a in shown)} {ptype.title()}".replace("  ", " ")
    features = "; ".join(attributes)
    description = f"The {brand} {ptype} is made for everyday use. Features: {features}."
    return Product(_asin(rng), category, ptype, title, tuple(attributes), options, price, description)


def _random_product(rng: random.Random, category: str | None = None, ptype: str | None = None) -> Product:
    category = category or rng.choice(sorted(CATEGORIES))
    types, attributes, kinds = CATEGORIES[category]
    ptype = ptype or rng.choice(types)
    attrs = rng.sample(attributes, rng.randint(2, 4))
    options = {k: tuple(sorted(rng.sample(v, rng.randint(2, len(v))), key=v.index)) for k, v in kinds.items() if rng.random() < 0.9}
    return _product(rng, category, ptype, attrs, options, round(rng.uniform(5, 80)) - 0.01)


def make_shop(rng: random.Random, num_products: int = 40, num_goal_attributes: int = 2) -> Shop:
    """A seeded catalogue and goal; the catalogue includes near misses of the goal (see the module docstring)."""
    category = rng.choice(sorted(CATEGORIES))
    types, attributes, kinds = CATEGORIES[category]
    ptype = rng.choice(types)
    goal_attrs = rng.sample(attributes, num_goal_attributes)
    extra = rng.sample([a for a in attributes if a not in goal_attrs], rng.randint(0, 2))
    options = {k: tuple(sorted(rng.sample(v, rng.randint(2, len(v))), key=v.index)) for k, v in kinds.items()}
    price = round(rng.uniform(10, 70)) - 0.01
    target = _product(rng, category, ptype, goal_attrs + extra, options, price)
    goal = Goal(target.asin, category, ptype, tuple(goal_attrs), {k: rng.choice(v) for k, v in options.items()},
                float(math.ceil((price + rng.randint(1, 15)) / 10) * 10))
    near = []
    for i in range(min(6, max(0, num_products - 1))):
        p = _random_product(rng, category, ptype)
        if i % 3 == 0:  # one goal attribute only
            keep = [goal_attrs[0]] + [a for a in p.attributes if a not in goal_attrs]
            p = replace(p, attributes=tuple(keep))
        elif i % 3 == 1:  # every attribute, but over the price limit
            p = replace(p, attributes=tuple(dict.fromkeys(goal_attrs + list(p.attributes))), price=goal.price_limit + rng.randint(5, 30) - 0.01)
        else:  # every attribute, but not the asked option values
            kind = next(iter(goal.options))
            p = replace(p, attributes=tuple(dict.fromkeys(goal_attrs + list(p.attributes))),
                        options={**p.options, kind: tuple(v for v in kinds[kind] if v != goal.options[kind])})
        near.append(p)
    others = [_random_product(rng) for _ in range(max(0, num_products - 1 - len(near)))]
    catalogue = [target, *near, *others]
    rng.shuffle(catalogue)
    return Shop(catalogue, goal)


def reward_components(goal: Goal, product: Product, selected: dict[str, str]) -> dict[str, float]:
    """WebShop's purchase reward, split into ``attributes``, ``options``, ``price`` and ``type`` (they sum to r)."""
    denominator = len(goal.attributes) + len(goal.options) + 1
    parts = {
        "attributes": sum(a in product.attributes for a in goal.attributes) / denominator,
        "options": sum(selected.get(k) == v for k, v in goal.options.items()) / denominator,
        "price": float(product.price <= goal.price_limit) / denominator,
    }
    r_type = 1.0 if product.type == goal.type else 0.5 if product.category == goal.category else 0.1
    parts["type"] = (r_type - 1.0) * sum(parts.values())
    return parts


def parse_action(text: str) -> tuple[str, str] | None:
    """``("search", query)`` or ``("click", button)`` for the last action in ``text`` (in the last answer tag if any)."""
    tagged = _ANSWER.findall(text)
    matches = _ACTION.findall(tagged[-1] if tagged else text)
    if not matches:
        return None
    verb, arg = matches[-1]
    return verb.lower(), " ".join(arg.split())


class WebShop(Env):
    """Find and buy the product the instruction describes (see the module docstring).

    Args:
        num_products: catalogue size per seed.
        page_size: results per results page.
        num_goal_attributes: attributes the instruction asks for.
    """

    instructions = (
        "You shop in a web store. Find and buy the product that matches the instruction: its type, attributes, "
        "options and price. Answer with one action: search[query] on the search page, or click[button] with a "
        "button or product id shown on the page. Select every asked option on the product page before clicking "
        "Buy Now."
    )

    def __init__(self, num_products: int = 40, page_size: int = 5, num_goal_attributes: int = 2) -> None:
        if num_products < 1:
            raise ValueError(f"num_products={num_products} must be >= 1")
        if page_size < 1:
            raise ValueError(f"page_size={page_size} must be >= 1")
        if not 1 <= num_goal_attributes <= 4:
            raise ValueError(f"num_goal_attributes={num_goal_attributes} must be between 1 and 4")
        self.num_products, self.page_size, self.num_goal_attributes = num_products, page_size, num_goal_attributes
        self._rng = random.Random()
        self.shop = make_shop(random.Random(0), num_products, num_goal_attributes)
        self.view = View()
        self.done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Build the catalogue and instruction for ``seed``; start on the search page. ``info["goal"]`` is the instruction."""
        if seed is not None:
            self._rng = random.Random(seed)
        self.shop = make_shop(self._rng, self.num_products, self.num_goal_attributes)
        self.view, self.done = View(), False
        return self.render(), {"goal": self.shop.goal.text, "target": self.shop.goal.asin}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the last action in ``action_text``; ``Buy Now`` ends the episode with WebShop's reward."""
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset() first")
        zero = {"attributes": 0.0, "options": 0.0, "price": 0.0, "type": 0.0}
        parsed = parse_action(action_text)
        problem = self._why_invalid(parsed)
        if problem:
            info = {"actions": [], "valid": False, "success": False, "reward_components": zero}
            return f"{problem}\n\n{self.render()}", 0.0, False, False, info
        verb, arg = parsed
        action = f"{verb}[{arg}]"
        if verb == "search":
            self.view = View(RESULTS, query=arg)
            info = {"actions": [action], "valid": True, "success": False, "reward_components": zero}
            return self.render(), 0.0, False, False, info
        button = self._buttons(self.shop, self.view)[arg.lower()]
        if button == BUY:
            product = self.shop.by_asin[self.view.asin]
            parts = reward_components(self.shop.goal, product, self.view.chosen())
            reward = sum(parts.values())
            self.done = True
            success = math.isclose(reward, 1.0)
            info = {"actions": [f"click[{BUY}]"], "valid": True, "success": success, "reward_components": parts,
                    "bought": product.asin, "selected": self.view.chosen()}
            verdict = "It matches the instruction." if success else f"Score {reward:.2f} of 1.00: it does not fully match."
            return f"Thank you for shopping with us. You bought: {product.title}\n{verdict}", reward, True, False, info
        self.view = self._click(button)
        info = {"actions": [f"click[{button}]"], "valid": True, "success": False, "reward_components": zero}
        return self.render(), 0.0, False, False, info

    def task_key(self) -> str:
        """The instruction (product type, attributes, options, price limit): what the agent is asked to buy."""
        return self.shop.goal.text

    def anchor(self) -> str:
        """The goal and the view (page, query, results page, product, selected options)."""
        v = self.view
        return f"{self.shop.goal.asin}|{v.page}|{v.query}|{v.page_no}|{v.asin}|{','.join(f'{k}={x}' for k, x in sorted(v.selected))}"

    def solve(self) -> list[str] | None:
        """A plan that buys the goal product with the asked options: through the current results when they hold it,
        else through a new search for its type and attributes: the shorter one. None once the episode is over (a
        purchase cannot be undone)."""
        if self.done:
            return None
        goal, v = self.shop.goal, self.view
        finish = [f"click[{val}]" for kind, val in goal.options.items() if v.chosen().get(kind) != val or v.asin != goal.asin]
        finish.append(f"click[{BUY}]")
        if v.asin == goal.asin and v.page == ITEM:
            return finish
        plans = []
        if v.page == DESCRIPTION and v.asin == goal.asin:
            plans.append([f"click[{PREV}]"] + finish)
        if v.page in (RESULTS, ITEM, DESCRIPTION) and v.query:
            via = self._via_results(v.query, v.page_no)
            if via is not None:
                back = {RESULTS: [], ITEM: [f"click[{PREV}]"], DESCRIPTION: [f"click[{PREV}]", f"click[{PREV}]"]}[v.page]
                plans.append(back + via + self._select_and_buy(goal))
        query = " ".join([goal.type, *goal.attributes])
        listed = self._via_results(query, 0)
        if listed is not None:  # always: the goal product holds every word of this query
            plans.append(([] if v.page == SEARCH else [f"click[{BACK}]"]) + [f"search[{query}]"] + listed + self._select_and_buy(goal))
        return min(plans, key=len) if plans else None

    def examples(self) -> list[tuple[str, str]]:
        """Two exchanges on a fixed shop (not any seed's): the search page -> a search; the product page -> an option."""
        shop = make_shop(random.Random("webshop-example"), self.num_products, self.num_goal_attributes)
        goal = shop.goal
        query = " ".join([goal.type, *goal.attributes])
        kind, value = next(iter(goal.options.items()))
        return [
            (self._render(shop, View()), f"search[{query}]"),
            (self._render(shop, View(ITEM, query=query, asin=goal.asin)), f"click[{value}]"),
        ]

    def render(self) -> str:
        return self._render(self.shop, self.view)

    # ---- mechanics ------------------------------------------------------------------------------------------

    def _select_and_buy(self, goal: Goal) -> list[str]:
        return [f"click[{val}]" for val in goal.options.values()] + [f"click[{BUY}]"]

    def _via_results(self, query: str, page_no: int) -> list[str] | None:
        """Clicks from results page ``page_no`` of ``query`` to the goal's product page; None if it is not listed."""
        hits = [p.asin for p in self.shop.search(query)]
        if self.shop.goal.asin not in hits:
            return None
        target_page = hits.index(self.shop.goal.asin) // self.page_size
        moves = [f"click[{NEXT}]"] * (target_page - page_no) + [f"click[{PREV}]"] * (page_no - target_page)
        return moves + [f"click[{self.shop.goal.asin}]"]

    def _buttons(self, shop: Shop, v: View) -> dict[str, str]:
        """Clickable texts on page ``v``: lower-cased text -> canonical button (a product id or option value)."""
        buttons: list[str] = []
        if v.page == RESULTS:
            hits = shop.search(v.query)
            buttons = [BACK] + ([PREV] if v.page_no > 0 else []) + ([NEXT] if (v.page_no + 1) * self.page_size < len(hits) else [])
            buttons += [p.asin for p in hits[v.page_no * self.page_size:(v.page_no + 1) * self.page_size]]
        elif v.page == ITEM:
            product = shop.by_asin[v.asin]
            buttons = [BACK, PREV, DESC, *(val for vals in product.options.values() for val in vals), BUY]
        elif v.page == DESCRIPTION:
            buttons = [BACK, PREV]
        return {b.lower(): b for b in buttons}

    def _why_invalid(self, parsed: tuple[str, str] | None) -> str:
        """The feedback for an action that cannot run on this page, or ``""`` when it can."""
        if parsed is None:
            return "Invalid action: answer with search[query] or click[button]."
        verb, arg = parsed
        if verb == "search":
            if self.view.page != SEARCH:
                return f"Invalid action search[{arg}]: search only works on the search page (click[{BACK}] first)."
            return "" if arg else "Invalid action: search[] needs a query."
        if self.view.page == SEARCH:
            return f"Invalid action click[{arg}]: the search page has no buttons; use search[query]."
        return "" if arg.lower() in self._buttons(self.shop, self.view) else f"Invalid action click[{arg}]: there is no such button on this page."

    def _click(self, button: str) -> View:
        v = self.view
        if button == BACK:
            return View()
        if v.page == RESULTS:
            if button == NEXT:
                return replace(v, page_no=v.page_no + 1)
            if button == PREV:
                return replace(v, page_no=v.page_no - 1)
            return replace(v, page=ITEM, asin=button, selected=())
        if v.page == ITEM:
            if button == PREV:
                return replace(v, page=RESULTS, asin="", selected=())
            if button == DESC:
                return replace(v, page=DESCRIPTION)
            product = self.shop.by_asin[v.asin]
            kind = next(k for k, vals in product.options.items() if button in vals)
            return replace(v, selected=tuple(sorted({**v.chosen(), kind: button}.items())))
        return replace(v, page=ITEM)  # description page: < Prev

    def _render(self, shop: Shop, v: View) -> str:
        lines = [f"Instruction: {shop.goal.text}"]
        if v.page == SEARCH:
            lines += ["[Search]", "Actions: search[<query>]"]
            return "\n".join(lines)
        buttons = list(self._buttons(shop, v).values())
        if v.page == RESULTS:
            hits = shop.search(v.query)
            pages = max(1, math.ceil(len(hits) / self.page_size))
            lines.append(f'Results for "{v.query}": page {v.page_no + 1} of {pages} ({len(hits)} products)')
            for p in hits[v.page_no * self.page_size:(v.page_no + 1) * self.page_size]:
                lines.append(f"[{p.asin}] {p.title} - ${p.price:.2f}")
            if not hits:
                lines.append("No products match. Go back and search with other words.")
            navigation = [b for b in buttons if b in (BACK, PREV, NEXT)]
            lines.append("Actions: " + ", ".join(f"click[{b}]" for b in navigation) + (", click[<product id>]" if hits else ""))
            return "\n".join(lines)
        product = shop.by_asin[v.asin]
        lines += [product.title, f"Price: ${product.price:.2f}"]
        if v.page == DESCRIPTION:
            lines.append(product.description)
            lines.append(f"Actions: click[{PREV}], click[{BACK}]")
            return "\n".join(lines)
        chosen = v.chosen()
        for kind, values in product.options.items():
            picked = f" (selected: {chosen[kind]})" if kind in chosen else ""
            lines.append(f"{kind}: " + " ".join(f"[{val}]" for val in values) + picked)
        lines.append(f"Actions: click[{BACK}], click[{PREV}], click[{DESC}], click[<option>], click[{BUY}]")
        return "\n".join(lines)
