"""Text-to-SQL with tools on a seeded, read-only SQLite database.

Database (seeded, in memory). Three related tables with seeded rows and invented names::

    customers(id, name, city, signup_year)                 -- num_customers rows
    products(id, name, category, price)                    -- num_products rows
    orders(id, customer_id, product_id, quantity, order_year)  -- num_orders rows

Question (seeded): one of eight templates with seeded parameters and a gold query, redrawn until the gold
result is non-empty (filters, counts, sums over a join, a GROUP BY, DISTINCT over two joins, an average,
a maximum). Observation: the question and the table names.

Tools (see :class:`~turnrl.envs.tools.env.ToolEnv` for the call format and errors):

- ``list_tables()``; ``describe_table(name)``: its columns, types and three sample rows;
- ``run_query(sql)``: the result (column names, then at most ``max_rows`` rows, with a note when cut);
- ``submit(sql)``: the final query; ends the episode. A query that fails to run is an error observation and
  the episode goes on.

Safety. Queries run read-only, three ways: the connection has ``PRAGMA query_only = ON``; an authorizer
(``set_authorizer``) allows only reading actions (SELECT, READ, FUNCTION, RECURSIVE), so ``ATTACH``,
``PRAGMA``, ``CREATE``, ``INSERT``, ``DROP`` ... are denied even inside a ``WITH``; and the text must be one
statement starting with ``SELECT`` or ``WITH``. A progress handler aborts a query after ``query_timeout``
seconds (an infinite recursive CTE is stopped, not waited for). ``run_query`` reads at most ``max_rows + 1``
rows, ``submit`` at most ``10 * max_rows`` (a longer result does not match).

Reward (on ``submit``), two named components:

- ``execution``: ``1 - column_weight`` when the submitted result equals the gold result as a multiset of rows
  (row order ignored, unless the gold query orders; floats rounded to 6 decimals; column names ignored);
- ``columns``: ``column_weight`` (default 0.2) times the fraction of the gold result's columns whose values
  (as a multiset) appear as some distinct column of the submitted result: dense partial credit for the right
  data in the wrong shape (an extra column, a missing one). An execution match implies all columns match,
  so the maximum reward is 1.0. Success means an execution match.

The oracle submits the gold query.
"""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from turnrl.envs.tools import Tool, ToolCall, ToolEnv, ToolError, Verdict, make_tool

_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
_READ_ONLY_START = re.compile(r"^\s*(select|with)\b", re.IGNORECASE)
_CITIES = ["Ostrava Bay", "Kelmor", "Dunwick", "Aravel", "Pellsford", "Trinmoor"]
_CATEGORIES = ["tools", "garden", "kitchen", "toys", "books"]
_SYLLABLES = ["ka", "lo", "mir", "ve", "dan", "sol", "tur", "ne", "bri", "os", "fen", "ra", "gul", "thi"]
_ITEMS = ["lamp", "kettle", "rake", "puzzle", "atlas", "chisel", "vase", "kite", "ladle", "trowel", "journal", "spinner"]
SCHEMA = (
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, signup_year INTEGER NOT NULL);"
    "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL);"
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), "
    "product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL, order_year INTEGER NOT NULL);"
)


@dataclass
class Result:
    """A query's column names and rows."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False


def build_database(rng: random.Random, num_customers: int = 8, num_products: int = 10, num_orders: int = 30) -> sqlite3.Connection:
    """A new in-memory database with seeded rows, opened read-only for queries (see the module docstring)."""
    con = sqlite3.connect(":memory:", check_same_thread=False)  # tools run in a worker thread
    con.executescript(SCHEMA)
    used: set[str] = set()
    for i in range(1, num_customers + 1):
        while (name := "".join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize() + " " + "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()) in used:
            pass
        used.add(name)
        con.execute("INSERT INTO customers VALUES (?, ?, ?, ?)", (i, name, rng.choice(_CITIES[:4]), rng.randint(2018, 2023)))
    for i in range(1, num_products + 1):
        while (name := f"{''.join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize()} {rng.choice(_ITEMS)}") in used:
            pass
        used.add(name)
        con.execute("INSERT INTO products VALUES (?, ?, ?, ?)", (i, name, rng.choice(_CATEGORIES), round(rng.uniform(2, 80), 2)))
    for i in range(1, num_orders + 1):
        con.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                    (i, rng.randint(1, num_customers), rng.randint(1, num_products), rng.randint(1, 5), rng.randint(2020, 2024)))
    con.commit()
    con.execute("PRAGMA query_only = ON")
    con.set_authorizer(_authorize)
    return con


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def run_read_only(con: sqlite3.Connection, sql: str, max_rows: int, timeout: float) -> Result:
    """Run one read-only query with a time limit; :class:`ToolError` (with a message for the model) otherwise.

    At most ``max_rows`` rows are returned (``truncated`` says when there were more).
    """
    if not _READ_ONLY_START.match(sql):
        raise ToolError("only read-only queries are allowed: start with SELECT or WITH")
    deadline = time.monotonic() + timeout
    con.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        cursor = con.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
        columns = [d[0] for d in cursor.description or []]
    except (sqlite3.Error, sqlite3.Warning) as e:  # Warning: "one statement at a time" on older Pythons
        if "interrupted" in str(e):
            raise ToolError(f"the query ran longer than {timeout:g} s and was stopped") from None
        if "not authorized" in str(e) or "readonly" in str(e) or "query_only" in str(e):
            raise ToolError(f"not allowed: {e} (queries are read-only)") from None
        raise ToolError(f"SQL error: {e}") from None
    finally:
        con.set_progress_handler(None, 0)
    return Result(columns, [tuple(r) for r in rows[:max_rows]], len(rows) > max_rows)


def _norm(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def execution_match(pred: Result, gold: Result, ordered: bool = False) -> bool:
    """Row multisets equal (in order when ``ordered``), column names ignored, floats rounded to 6 decimals."""
    p = [tuple(_norm(v) for v in r) for r in pred.rows]
    g = [tuple(_norm(v) for v in r) for r in gold.rows]
    if len(pred.columns) != len(gold.columns):
        return False
    return p == g if ordered else Counter(p) == Counter(g)


def column_match(pred: Result, gold: Result) -> float:
    """The fraction of gold columns whose value multiset equals a distinct predicted column's (greedy, in order)."""
    if not gold.columns:
        return 0.0
    pred_cols = [Counter(_norm(r[i]) for r in pred.rows) for i in range(len(pred.columns))]
    used: set[int] = set()
    matched = 0
    for j in range(len(gold.columns)):
        col = Counter(_norm(r[j]) for r in gold.rows)
        k = next((i for i, c in enumerate(pred_cols) if i not in used and c == col), None)
        if k is not None:
            used.add(k)
            matched += 1
    return matched / len(gold.columns)


def _questions(con: sqlite3.Connection, rng: random.Random) -> tuple[str, str]:
    """One seeded ``(question, gold query)`` (parameters drawn from the data)."""
    names = [r[0] for r in con.execute("SELECT name FROM customers ORDER BY id")]
    cities = sorted({r[0] for r in con.execute("SELECT city FROM customers")})
    cats = sorted({r[0] for r in con.execute("SELECT category FROM products")})
    years = sorted({r[0] for r in con.execute("SELECT order_year FROM orders")})
    kind = rng.randrange(8)
    city, cat, year, name = rng.choice(cities), rng.choice(cats), rng.choice(years), rng.choice(names)
    price = rng.choice([10, 20, 30, 40, 50])
    if kind == 0:
        return f"List the names of the customers who live in {city}.", f"SELECT name FROM customers WHERE city = '{city}'"
    if kind == 1:
        return f"How many orders were placed in {year}?", f"SELECT COUNT(*) FROM orders WHERE order_year = {year}"
    if kind == 2:
        return (f"What is the total quantity ordered of products in the '{cat}' category?",
                f"SELECT SUM(o.quantity) FROM orders o JOIN products p ON o.product_id = p.id WHERE p.category = '{cat}'")
    if kind == 3:
        return ("For each city, how many customers live there? Give the city and the count.",
                "SELECT city, COUNT(*) FROM customers GROUP BY city")
    if kind == 4:
        return (f"Which products did {name} order? List each product name once.",
                "SELECT DISTINCT p.name FROM orders o JOIN customers c ON o.customer_id = c.id "
                f"JOIN products p ON o.product_id = p.id WHERE c.name = '{name}'")
    if kind == 5:
        return (f"List the name and price of the products that cost more than {price}.",
                f"SELECT name, price FROM products WHERE price > {price}")
    if kind == 6:
        return (f"What is the average price of the products in the '{cat}' category?",
                f"SELECT AVG(price) FROM products WHERE category = '{cat}'")
    return (f"What is the largest quantity in a single order placed in {year}?",
            f"SELECT MAX(quantity) FROM orders WHERE order_year = {year}")


class SQL(ToolEnv):
    """Answer a question about a seeded shop database with a SQL query (see the module docstring).

    Args:
        num_customers, num_products, num_orders: table sizes.
        max_rows: rows shown by ``run_query``.
        query_timeout: seconds before a query is aborted.
        column_weight: the weight of the ``columns`` partial-credit component (``execution`` gets the rest).
        max_actions_per_turn, tool_timeout: see :class:`~turnrl.envs.tools.env.ToolEnv`.
    """

    task_description = (
        "Answer the question about a shop database with one SQL query (SQLite). Look at the tables with "
        "list_tables and describe_table, try queries with run_query, then submit the query whose result answers "
        "the question. Queries are read-only."
    )
    final_tools = ("submit",)
    reward_names = ("execution", "columns")

    def __init__(self, num_customers: int = 8, num_products: int = 10, num_orders: int = 30, max_rows: int = 20,
                 query_timeout: float = 1.0, column_weight: float = 0.2, max_actions_per_turn: int = 1, tool_timeout: float = 5.0) -> None:
        if min(num_customers, num_products, num_orders) < 1:
            raise ValueError("num_customers, num_products and num_orders must be >= 1")
        if max_rows < 1 or query_timeout <= 0:
            raise ValueError(f"max_rows={max_rows} must be >= 1 and query_timeout={query_timeout} > 0")
        if not 0.0 <= column_weight < 1.0:
            raise ValueError(f"column_weight={column_weight} must be in [0, 1)")
        self.sizes = (num_customers, num_products, num_orders)
        self.max_rows, self.query_timeout, self.column_weight = max_rows, query_timeout, column_weight
        self._rng = random.Random()
        self.con: sqlite3.Connection | None = None
        self.question, self.gold_sql, self._database = "", "", ""
        self.gold: Result | None = None
        super().__init__(max_actions_per_turn=max_actions_per_turn, tool_timeout=max(tool_timeout, query_timeout + 1.0))

    def build_tools(self) -> list[Tool]:
        def list_tables() -> str:
            """List the tables of the database."""
            return ", ".join(t for t, in self._run("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").rows)

        def describe_table(name: str) -> str:
            """Show a table's columns with their types, and three sample rows.

            Args:
                name: the table name, e.g. "orders".
            """
            tables = [t for t, in self._run("SELECT name FROM sqlite_master WHERE type = 'table'").rows]
            if name not in tables:
                raise ToolError(f"no table {name!r}; tables: {', '.join(sorted(tables))}")
            sql = next(s for s, in self._run(f"SELECT sql FROM sqlite_master WHERE name = '{name}'").rows)
            return f"{sql}\n{_format(self._run(f'SELECT * FROM {name} LIMIT 3'))}"

        def run_query(sql: str) -> str:
            """Run a read-only SQL query and show its result.

            Args:
                sql: one SELECT statement.
            """
            return _format(self._run(sql))

        def submit(sql: str) -> str:
            """Submit the SQL query that answers the question.

            Args:
                sql: one SELECT statement.
            """
            raise AssertionError("submit is judged by verify()")

        return [make_tool(list_tables), make_tool(describe_table), make_tool(run_query), make_tool(submit)]

    def _run(self, sql: str, max_rows: int | None = None) -> Result:
        if self.con is None:
            raise ToolError("no database yet: the env must be reset first")
        return run_read_only(self.con, sql, max_rows or self.max_rows, self.query_timeout)

    def new_task(self, seed: int | None) -> None:
        if seed is not None:
            self._rng = random.Random(seed)
        self.close()
        self.con = build_database(self._rng, *self.sizes)
        rows = [list(self.con.execute(f"SELECT * FROM {table} ORDER BY id")) for table in ("customers", "products", "orders")]
        self._database = hashlib.sha1(repr(rows).encode()).hexdigest()[:12]
        while True:
            self.question, self.gold_sql = _questions(self.con, self._rng)
            self.gold = self._run(self.gold_sql, 10_000)
            if self.gold.rows and any(v is not None for v in self.gold.rows[0]):
                break

    def task_observation(self) -> str:
        return f"Question: {self.question}\nTables: customers, products, orders"

    def task_key(self) -> str:
        """The question and a digest of the database rows: ``"How many orders ...? [db 3fa9c1d2e4b5]"``."""
        return f"{self.question} [db {self._database}]"

    def verify(self, call: ToolCall) -> Verdict:
        assert self.gold is not None
        pred = self._run(call.arguments["sql"], 10 * self.max_rows)
        ordered = "order by" in self.gold_sql.lower()
        match = execution_match(pred, self.gold, ordered) and not pred.truncated
        cols = 1.0 if match else column_match(pred, self.gold)
        components = {"execution": (1 - self.column_weight) * float(match), "columns": self.column_weight * cols}
        message = "Correct: the result matches." if match else (
            f"Wrong result: {len(pred.rows)} row(s) x {len(pred.columns)} column(s); {cols:.0%} of the expected columns match.")
        return Verdict(components, match, message)

    def oracle_calls(self) -> list[ToolCall]:
        """Submit the gold query."""
        return [ToolCall("submit", {"sql": self.gold_sql})]

    def examples(self) -> list[tuple[str, str]]:
        """Two fixed questions on a database from a string seed (never a task seed), answered by submit."""
        return [
            ("Question: How many customers signed up in 2020?\nTables: customers, products, orders",
             ToolCall("submit", {"sql": "SELECT COUNT(*) FROM customers WHERE signup_year = 2020"}).to_text()),
            ("Question: List the names of the products in the 'toys' category.\nTables: customers, products, orders",
             ToolCall("submit", {"sql": "SELECT name FROM products WHERE category = 'toys'"}).to_text()),
        ]

    def render(self) -> str:
        lines = [self.task_observation(), *(f"called {s}" for s in self.history)]
        if self.last_verdict is not None:
            lines.append(self.last_verdict.message)
        return "\n".join(lines)

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None


def _format(result: Result) -> str:
    lines = [" | ".join(result.columns)]
    lines += [" | ".join("NULL" if v is None else str(v) for v in row) for row in result.rows]
    if not result.rows:
        lines.append("(no rows)")
    if result.truncated:
        lines.append(f"[only the first {len(result.rows)} rows are shown]")
    return "\n".join(lines)
