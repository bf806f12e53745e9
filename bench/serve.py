"""Rollout as a service: what an external agent playing through ``turnrl serve`` costs, and whether it records what the
in-process collector records.

The same FrozenLake tasks are played greedily (the same engine, ``rollout.context=full``, no few-shot examples) two
ways: by a plain agent loop over HTTP (chat messages to ``/v1/chat/completions``, the reward posted to
``/v1/sessions/ID/reward``; :mod:`turnrl.engines.serve`) and by :class:`~turnrl.rollout.Collector` in process, one
episode at a time (the server generates one request at a time, so this is the like-for-like baseline) and all
episodes at once (the collector's normal, batched mode). The collector runs in a worker thread, as the server's
requests do: on a machine whose cores other processes keep busy, the native engine was measured 10-40x slower in the
main thread than in a worker thread (the HF engine not), so the main-thread time is reported beside it, not compared. Measured: episodes per second of each, the HTTP path's
time relative to the sequential collector's, and exactness: the fraction of episodes whose served trajectory has the
collector's prompt and response ids turn for turn, and the largest logprob difference between the two.

    python bench/serve.py --smoke     # end-to-end check: a tiny random model, 4 tasks
    python bench/serve.py             # the default model (SmolLM2-135M-Instruct), 32 tasks

writes ``bench/results/serve.json`` (``served_episodes_per_s``, ``sequential_episodes_per_s``,
``batched_episodes_per_s``, ``http_time_ratio``, ``ids_equal_fraction``, ``max_logprob_diff``, ``episodes``).
Nothing is trained and no run directory is written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import write_result  # noqa: E402

from turnrl.agent.context import ContextSpec  # noqa: E402
from turnrl.engines import SamplingParams, make_engine  # noqa: E402
from turnrl.engines.serve import RolloutServer  # noqa: E402
from turnrl.engines.sessions import SessionStore  # noqa: E402
from turnrl.envs import make  # noqa: E402
from turnrl.models import load_model, load_tokenizer, tiny_model  # noqa: E402
from turnrl.rollout import Collector  # noqa: E402
from turnrl.types import Trajectory  # noqa: E402

ENV, MAX_TURNS = "frozenlake-v0", 8
WARM_UP = 10_000  # the seed of the untimed episode each path plays first
BUDGETS = {"smoke": dict(tasks=4, max_new_tokens=6), "full": dict(tasks=32, max_new_tokens=6)}


def post(url: str, body: dict, headers: dict[str, str] | None = None) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())


def play(url: str, seed: int, max_tokens: int) -> None:
    """One episode over HTTP, as docs/serve.md's agent plays it (greedy here)."""
    env = make(ENV, max_turns=MAX_TURNS)
    observation, _ = env.reset(seed=seed)
    messages = [{"role": "system", "content": env.instructions}, {"role": "user", "content": observation}]
    session, total = f"bench-{seed}", 0.0
    while True:
        reply = post(f"{url}/chat/completions", {"messages": messages, "max_tokens": max_tokens, "temperature": 0},
                     {"X-Turnrl-Session": session})
        text = reply["choices"][0]["message"]["content"]
        observation, reward, terminated, truncated, info = env.step(text)
        total += reward
        if terminated or truncated:
            break
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": observation}]
    post(f"{url}/sessions/{session}/reward", {"reward": total, "success": bool(info.get("success")), "seed": seed})


def same_ids(a: Trajectory, b: Trajectory) -> bool:
    return [(t.prompt_ids, t.response_ids) for t in a.turns] == [(t.prompt_ids, t.response_ids) for t in b.turns]


def logprob_diff(a: Trajectory, b: Trajectory) -> float:
    """The largest |logprob difference| over the tokens both trajectories have at the same place."""
    return max((abs(x - y) for s, t in zip(a.turns, b.turns) for x, y in zip(s.logprobs, t.logprobs)), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the reduced budget (an end-to-end check, not a measurement)")
    args = parser.parse_args()
    budget = BUDGETS["smoke" if args.smoke else "full"]
    tokenizer = load_tokenizer("default")
    model = tiny_model(tokenizer, seed=0) if args.smoke else load_model("default")
    engine = make_engine("auto", model, tokenizer, bf16=True, max_len=2048)
    greedy = SamplingParams(max_new_tokens=budget["max_new_tokens"], temperature=0.0)
    seeds = list(range(budget["tasks"]))
    collector = Collector(engine, tokenizer, lambda: make(ENV, max_turns=MAX_TURNS), ContextSpec("full", few_shot=False))

    store = SessionStore(tokenizer, None, ENV, session_timeout_s=600)
    with RolloutServer(engine, tokenizer, store, model_name="default", defaults=greedy, max_context_tokens=2048,
                       request_timeout_s=600) as server:
        collector.collect([WARM_UP], 1, greedy, env_id=ENV)  # kernels specialise per shape on first use: not timed
        play(server.url, WARM_UP, budget["max_new_tokens"])
        store.take(1, 1, timeout_s=1)
        sequential, t_main, t_sequential, t_served = [], 0.0, 0.0, 0.0
        with ThreadPoolExecutor(1) as worker:
            for s in seeds:  # interleaved, so a busy spell on the shared machine slows every path alike
                t0 = time.perf_counter()
                collector.collect([s], 1, greedy, env_id=ENV)
                t1 = time.perf_counter()
                sequential += worker.submit(collector.collect, [s], 1, greedy, ENV).result()[0].trajectories
                t2 = time.perf_counter()
                play(server.url, s, budget["max_new_tokens"])
                t_main, t_sequential, t_served = t_main + t1 - t0, t_sequential + t2 - t1, t_served + time.perf_counter() - t2
            served = {t.seed: t for [t] in store.take(len(seeds), 1, timeout_s=1)}
            t0 = time.perf_counter()
            worker.submit(collector.collect, seeds, 1, greedy, ENV).result()
            t_batched = time.perf_counter() - t0

    n = len(seeds)
    equal = sum(same_ids(served[s], t) for s, t in zip(seeds, sequential)) / n
    diff = max(logprob_diff(served[s], t) for s, t in zip(seeds, sequential))
    turns = sum(t.num_turns for t in sequential)
    print(f"{ENV}, {n} tasks ({turns} turns), greedy, {type(engine).__name__}, "
          f"{'tiny random model' if args.smoke else 'SmolLM2-135M-Instruct'}:")
    print(f"  served over HTTP          {n / t_served:6.2f} episodes/s ({t_served:.1f} s)")
    print(f"  collector, one at a time  {n / t_sequential:6.2f} episodes/s ({t_sequential:.1f} s)   baseline")
    print(f"  collector, batched        {n / t_batched:6.2f} episodes/s ({t_batched:.1f} s)")
    print(f"  collector, one at a time, main thread  {n / t_main:6.2f} episodes/s ({t_main:.1f} s)")
    print(f"  HTTP time / sequential collector time: {t_served / t_sequential:.2f}x")
    print(f"  served trajectories with the collector's ids: {equal:.3f}; largest logprob difference {diff:.2e}")
    path = write_result("serve", {
        "budget": "smoke" if args.smoke else "full", **budget, "episodes": n, "turns": turns,
        "engine": type(engine).__name__, "served_episodes_per_s": n / t_served,
        "sequential_episodes_per_s": n / t_sequential, "batched_episodes_per_s": n / t_batched,
        "main_thread_sequential_episodes_per_s": n / t_main,
        "http_time_ratio": t_served / t_sequential, "ids_equal_fraction": equal, "max_logprob_diff": diff,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
