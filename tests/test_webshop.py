"""webshop-v0: seeded shop, paged search, product pages with options, WebShop's purchase reward, an oracle."""

import random

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.webshop import BUY, Goal, Product, WebShop, make_shop, parse_action, reward_components


def _play(env, actions):
    out = None
    for a in actions:
        out = env.step(a)
    return out


def test_seeded_catalogue_and_instruction():
    a, b = WebShop(), WebShop()
    assert a.reset(seed=4) == b.reset(seed=4) and a.shop.catalogue == b.shop.catalogue
    instructions = {WebShop().reset(seed=s)[1]["goal"] for s in range(30)}
    assert len(instructions) == 30
    obs, info = a.reset(seed=4)
    goal = a.shop.goal
    assert obs.startswith(f"Instruction: {goal.text}") and "search[<query>]" in obs
    assert goal.type in goal.text and all(attr in goal.text for attr in goal.attributes)
    assert all(f"{k}: {v}" in goal.text for k, v in goal.options.items()) and f"{goal.price_limit:.2f} dollars" in goal.text
    assert len(a.shop.catalogue) == 40 and info["target"] == goal.asin


def test_catalogue_holds_near_misses_of_the_goal():
    for seed in range(20):
        shop = make_shop(random.Random(seed))
        goal = shop.goal
        same_type = [p for p in shop.catalogue if p.type == goal.type and p.asin != goal.asin]
        assert any(p.price > goal.price_limit and set(goal.attributes) <= set(p.attributes) for p in same_type)
        assert any(not set(goal.attributes) <= set(p.attributes) for p in same_type)
        target = shop.by_asin[goal.asin]
        assert reward_components(goal, target, goal.options) == pytest.approx(
            {"attributes": 2 / 5, "options": 2 / 5, "price": 1 / 5, "type": 0.0})


@pytest.mark.parametrize("seed", range(40))
def test_oracle_buys_the_goal_with_full_reward(seed):
    env = make("webshop-v0")
    env.reset(seed=seed)
    plan = env.solve()
    assert plan[0].startswith("search[") and plan[-1] == f"click[{BUY}]" and len(plan) <= 15
    _, reward, terminated, truncated, info = _play(env, plan)
    assert terminated and not truncated and info["success"] and reward == pytest.approx(1.0)
    assert info["bought"] == env.unwrapped.shop.goal.asin


@pytest.mark.parametrize("seed", range(15))
def test_oracle_succeeds_from_states_reached_by_random_clicks(seed):
    env = WebShop()
    env.reset(seed=seed)
    rng = random.Random(seed)
    env.step(f"search[{rng.choice([env.shop.goal.type, 'black', 'organic soft', env.shop.goal.attributes[0]])}]")
    for _ in range(rng.randint(0, 4)):
        buttons = [b for b in env._buttons(env.shop, env.view).values() if b != BUY]
        if buttons:
            env.step(f"click[{rng.choice(buttons)}]")
    plan = env.solve()
    _, reward, terminated, _, info = _play(env, plan)
    assert terminated and info["success"] and reward == pytest.approx(1.0)


def test_paging_product_page_options_and_description():
    env = WebShop(page_size=3)
    env.reset(seed=2)
    obs, *_ = env.step(f"search[{env.shop.goal.category}]")  # every product of the goal's category
    assert "page 1 of" in obs and "click[Next >]" in obs and "click[< Prev]" not in obs
    first_page = [line for line in obs.splitlines() if line.startswith("[B0")]
    assert len(first_page) == 3
    obs, *_ = env.step("click[next >]")  # button text is case-insensitive
    assert "page 2 of" in obs and "click[< Prev]" in obs
    assert not set(first_page) & {line for line in obs.splitlines() if line.startswith("[B0")}
    asin = obs.split("[B0", 1)[1].split("]")[0]
    obs, *_ = env.step(f"click[B0{asin}]")
    product = env.shop.by_asin["B0" + asin]
    assert product.title in obs and f"${product.price:.2f}" in obs
    kind, values = next(iter(product.options.items()))
    obs, *_ = env.step(f"I will pick click[{values[-1]}]")
    assert f"(selected: {values[-1]})" in obs and env.view.chosen() == {kind: values[-1]}
    obs, *_ = env.step("click[Description]")
    assert "Features:" in obs and all(a in obs for a in product.attributes)
    env.step("click[< Prev]")
    assert env.view.page == "item" and env.view.chosen() == {kind: values[-1]}  # selections survive the detour
    env.step("click[< Prev]")
    assert env.view.page == "results" and env.view.page_no == 1
    env.step("click[Back to Search]")
    assert env.view.page == "search"


def test_wrong_purchases_earn_partial_reward_with_named_components():
    env = WebShop()
    env.reset(seed=6)
    goal = env.shop.goal
    target = env.shop.by_asin[goal.asin]
    # the right product without selecting options: attributes and price only
    query = " ".join([goal.type, *goal.attributes])
    _, r, term, _, info = _play(env, [f"search[{query}]", *env._via_results(query, 0), "click[Buy Now]"])
    assert term and not info["success"] and r == pytest.approx(3 / 5)
    assert info["reward_components"] == pytest.approx({"attributes": 0.4, "options": 0.0, "price": 0.2, "type": 0.0})
    # another category: everything is scaled by 0.1 and the type component says so
    other = next(p for p in env.shop.catalogue if p.category != goal.category)
    parts = reward_components(goal, other, {})
    base = parts["attributes"] + parts["options"] + parts["price"]
    assert parts["type"] == pytest.approx(-0.9 * base) and sum(parts.values()) == pytest.approx(0.1 * base)
    same_cat = Product("B0X", goal.category, "other type", "t", target.attributes, target.options, target.price, "")
    assert sum(reward_components(goal, same_cat, goal.options).values()) == pytest.approx(0.5)


def test_success_reward_pays_nothing_for_a_near_miss_and_one_for_the_target():
    from turnrl.envs import make

    env = make("webshop-v0", reward="success", invalid_penalty=0.1)
    env.reset(seed=6)
    goal = env.unwrapped.shop.goal
    query = " ".join([goal.type, *goal.attributes])
    _, r, term, _, info = _play(env, [f"search[{query}]", *env.unwrapped._via_results(query, 0), "click[Buy Now]"])
    assert term and not info["success"] and r == 0.0 and info["env_reward"] == pytest.approx(3 / 5)
    assert info["reward_components"] == {"success": 0.0}
    env.reset(seed=6)
    total = 0.0
    for action in env.solve():
        _, r, term, _, info = env.step(action)
        total += r
    assert term and info["success"] and r == 1.0 and total == 1.0
    env.reset(seed=6)
    _, r, _, _, info = env.step("no action here")
    assert r == -0.1 and info["reward_components"] == {"success": 0.0, "invalid_penalty": -0.1}
    with pytest.raises(ValueError, match="'env' keeps"):
        make("webshop-v0", reward="partial")


def test_reward_formula_on_a_hand_built_case():
    goal = Goal("B0T", "shoes", "boots", ("waterproof", "leather"), {"size": "9", "color": "brown"}, 50.0)
    boots = Product("B0T", "shoes", "boots", "Boots", ("waterproof", "rubber sole"), {"size": ("9",), "color": ("brown",)}, 55.0, "")
    parts = reward_components(goal, boots, {"size": "9"})
    assert parts == pytest.approx({"attributes": 1 / 5, "options": 1 / 5, "price": 0.0, "type": 0.0})


@pytest.mark.parametrize(
    "text, expected",
    [
        ("search[red shoes]", ("search", "red shoes")),
        ("Thought: find it. Action: click[ Buy  Now ]", ("click", "Buy Now")),
        ("click[a] then click[b]", ("click", "b")),  # the last action counts
        ("<answer>click[Next >]</answer> or search[x]", ("click", "Next >")),
        ("CLICK[Description]", ("click", "Description")),
        ("buy it now", None),
        ("", None),
    ],
)
def test_action_parsing(text, expected):
    assert parse_action(text) == expected


def test_invalid_actions_explain_and_change_nothing():
    env = make("webshop-v0", invalid_penalty=0.05)
    obs0, _ = env.reset(seed=1)
    anchor = env.anchor()
    for text, needle in [("let me think", "answer with search[query] or click[button]"),
                         ("click[Buy Now]", "the search page has no buttons"), ("search[]", "needs a query")]:
        obs, r, term, _, info = env.step(text)
        assert needle in obs and obs.endswith(obs0) and not info["valid"] and r == pytest.approx(-0.05) and not term
        assert env.anchor() == anchor
    env.step("search[coffee]")
    anchor = env.anchor()
    for text, needle in [("search[tea]", "only works on the search page"), ("click[B0NOTREAL1]", "no such button")]:
        obs, _, _, _, info = env.step(text)
        assert needle in obs and not info["valid"] and env.anchor() == anchor


def test_examples_and_anchor():
    env = WebShop()
    ex = env.examples()
    assert [resp.split("[")[0] for _, resp in ex] == ["search", "click"] and ex == WebShop().examples()
    env.reset(seed=3)
    start = env.anchor()
    env.step("search[black]")
    assert env.anchor() != start
    env.step("click[Back to Search]")
    assert env.anchor() == start


def test_check_env_and_bad_arguments():
    check_env("webshop-v0", seeds=(0, 1, 2), random_tasks=True)
    check_env("webshop-v0", seeds=(3, 4), random_tasks=True, num_products=10, page_size=2)
    with pytest.raises(ValueError, match="page_size"):
        WebShop(page_size=0)


def test_playable_by_hand():
    from turnrl.envs.play import play

    env = WebShop()
    env.reset(seed=9)
    plan = env.solve()
    lines = iter(["?", *plan])
    printed = []
    result = play("webshop-v0", seed=9, input_fn=lambda _: next(lines), print_fn=lambda *a: printed.append(" ".join(map(str, a))))
    assert result["success"] and result["turns"] == len(plan) and f"oracle: {plan[0]}" in printed


def test_progress_shaping_follows_the_oracle_and_a_wrong_purchase_ends_without_a_plan():
    env = make("webshop-v0", progress_reward=0.1)
    env.reset(seed=0)
    plan = env.solve()
    returns = [env.step(a)[1] for a in plan]
    assert sum(returns) == pytest.approx(1.0 + 0.1 * len(plan))
    env.reset(seed=0)
    query = " ".join([env.unwrapped.shop.goal.type, *env.unwrapped.shop.goal.attributes])
    _play(env, [f"search[{query}]", *env.unwrapped._via_results(query, 0)])
    _, r, term, _, info = env.step("click[Buy Now]")  # no options selected: partial reward, and no plan is left
    assert term and env.solve() is None and info["reward_components"]["progress"] == pytest.approx(-0.1)


def test_task_key_is_the_instruction():
    env = WebShop()
    env.reset(seed=8)
    key = env.task_key()
    assert key == env.shop.goal.text
    env.step("search[shoes]")
    assert env.task_key() == key
    assert len({(env.reset(seed=s), env.task_key())[1] for s in range(10)}) == 10
