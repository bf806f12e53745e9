"""sql-v0: a seeded read-only SQLite database, guarded queries, execution-match and column partial-credit rewards."""

import json
import random
import time

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.sql import SQL, Result, build_database, column_match, execution_match, run_read_only


def call(name, /, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def env():
    e = SQL()
    e.reset(seed=3)
    yield e
    e.close()


def test_check_env():
    check_env("sql-v0", seeds=range(5), random_tasks=True)


@pytest.mark.parametrize("seed", range(30))
def test_oracle_submits_the_gold_query_for_full_reward(seed):
    env = make("sql-v0")
    env.reset(seed=seed)
    assert env.unwrapped.gold.rows  # questions are redrawn until the gold result is non-empty
    _, reward, terminated, _, info = env.step(env.solve()[0])
    assert terminated and info["success"] and reward == pytest.approx(1.0)
    assert info["reward_components"] == {"execution": pytest.approx(0.8), "columns": pytest.approx(0.2)}
    env.close()


def test_database_is_seeded():
    a, b = build_database(random.Random(5)), build_database(random.Random(5))
    q = "SELECT * FROM customers JOIN orders ON orders.customer_id = customers.id"
    assert a.execute(q).fetchall() == b.execute(q).fetchall()
    assert a.execute("SELECT COUNT(*) FROM orders").fetchone() == (30,)


@pytest.mark.parametrize(
    "sql, needle",
    [
        ("DROP TABLE orders", "only read-only queries"),
        ("INSERT INTO orders VALUES (99, 1, 1, 1, 2020)", "only read-only queries"),
        ("ATTACH DATABASE ':memory:' AS other", "only read-only queries"),
        ("PRAGMA query_only = OFF", "only read-only queries"),
        ("WITH x AS (SELECT 1) INSERT INTO orders VALUES (99, 1, 1, 1, 2020)", "not allowed"),
        ("WITH x AS (SELECT 1) DELETE FROM orders", "not allowed"),
        ("SELECT * FROM pragma_table_info('orders')", "not allowed"),
        ("SELECT 1; DROP TABLE orders", "one statement"),
        ("SELECT nope FROM orders", "no such column: nope"),
    ],
)
def test_writes_attach_and_pragmas_are_rejected(env, sql, needle):
    obs, _, _, _, info = env.step(call("run_query", sql=sql))
    assert needle in obs and not info["valid"]
    assert env.con.execute("SELECT COUNT(*) FROM orders").fetchone() == (30,)  # nothing changed
    # the same guard holds for the connection used directly, without the prefix check
    with pytest.raises(Exception):
        env.con.execute("INSERT INTO orders VALUES (99, 1, 1, 1, 2020)")


def test_a_long_query_is_stopped_at_the_time_limit(env):
    start = time.monotonic()
    obs, _, _, _, info = env.step(call("run_query", sql="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"))
    assert "ran longer than 1 s and was stopped" in obs and not info["valid"]
    assert time.monotonic() - start < 3.0
    obs, _, _, _, info = env.step(call("run_query", sql="SELECT COUNT(*) FROM orders"))  # the connection still works
    assert obs.endswith("30\n</tool_response>") and info["valid"]


def test_results_are_row_limited(env):
    obs, _, _, _, _ = env.step(call("run_query", sql="SELECT id FROM orders ORDER BY id"))
    lines = obs.splitlines()
    assert lines[1] == "id" and lines[2] == "1" and lines[21] == "20" and "only the first 20 rows" in lines[22]
    result = run_read_only(env.con, "SELECT id FROM orders", max_rows=5, timeout=1.0)
    assert len(result.rows) == 5 and result.truncated


def test_schema_tools(env):
    obs, _, _, _, _ = env.step(call("list_tables"))
    assert "customers, orders, products" in obs
    obs, _, _, _, _ = env.step(call("describe_table", name="products"))
    assert "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL)" in obs
    assert "id | name | category | price" in obs
    obs, _, _, _, info = env.step(call("describe_table", name="users"))
    assert "no table 'users'; tables: customers, orders, products" in obs and not info["valid"]


def test_execution_and_column_match_hand_checked():
    gold = Result(["city", "n"], [("Kelmor", 2), ("Dunwick", 1)])
    assert execution_match(Result(["c", "count"], [("Dunwick", 1), ("Kelmor", 2)]), gold)  # order and names ignored
    assert not execution_match(Result(["c", "count"], [("Dunwick", 1), ("Kelmor", 2)]), gold, ordered=True)
    assert not execution_match(Result(["c", "count"], [("Kelmor", 2), ("Kelmor", 2), ("Dunwick", 1)]), gold)  # multiset
    assert execution_match(Result(["x"], [(0.1 + 0.2,)]), Result(["y"], [(0.3,)]))  # floats rounded
    assert column_match(Result(["city"], [("Dunwick",), ("Kelmor",)]), gold) == 0.5  # missing column
    assert column_match(Result(["n", "city", "extra"], [(1, "Dunwick", 7), (2, "Kelmor", 7)]), gold) == 1.0  # extra column
    assert column_match(Result(["city", "n"], [("Kelmor", 3), ("Dunwick", 1)]), gold) == 0.5  # a wrong count
    assert column_match(Result(["n", "n2"], [(2, 2), (1, 1)]), gold) == 0.5  # a predicted column is matched once


def test_submit_rewards_partial_columns_and_a_failing_submit_does_not_end_the_episode():
    env = SQL()
    env.reset(seed=0)
    assert env.gold_sql == "SELECT name, price FROM products WHERE price > 40"
    obs, _, terminated, _, info = env.step(call("submit", sql="SELECT nme FROM products"))
    assert "no such column: nme" in obs and not terminated and not info["valid"]
    obs, reward, terminated, _, info = env.step(call("submit", sql="SELECT name FROM products WHERE price > 40"))
    assert terminated and not info["success"] and "50% of the expected columns match" in obs
    assert info["reward_components"] == {"execution": 0.0, "columns": pytest.approx(0.1)} and reward == pytest.approx(0.1)
    env.close()


def test_close_is_idempotent_and_tools_need_a_reset():
    env = SQL()
    obs, _, _, _, info = env.step(call("list_tables"))
    assert "the env must be reset first" in obs and not info["valid"]
    env.reset(seed=1)
    env.close()
    env.close()


def test_the_same_question_on_another_database_is_another_task():
    env = SQL()
    keys, questions = [], []
    for seed in (2, 25, 27, 37):  # all ask "How many orders were placed in 2020?", each on its own database
        env.reset(seed=seed)
        keys.append(env.task_key())
        questions.append(env.question)
    assert len(set(questions)) == 1 and len(set(keys)) == 4 and keys[0].startswith(questions[0] + " [db ")
    twin = SQL()
    twin.reset(seed=25)
    assert twin.task_key() == keys[1]
