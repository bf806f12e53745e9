"""`turnrl play ENV`: play an environment yourself in the terminal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def play(env_id: str, seed: int | None = None, *, input_fn: Callable[[str], str] | None = None,
         print_fn: Callable[..., None] = print, **env_kwargs: Any) -> dict[str, Any]:
    """Play ``env_id`` (built by ``make(env_id, **env_kwargs)``, wrappers included) in the terminal.

    Prints the instructions and the observation, then reads one line per turn: free text goes to ``step``
    as a model's response would (so parsing is exercised too), ``?`` prints the oracle's next move, ``q``
    (or end of input) quits. After each step it prints the observation, the reward and its components, and
    how the episode ended. ``input_fn`` (default: ``input``) and ``print_fn`` let tests script a session.

    Returns ``{"return": float, "turns": int, "success": bool, "termination": "terminated" |
    "truncated (<reason>)" | "quit"}``; for a multi-agent env, :func:`~turnrl.envs.multiagent.hot_seat`'s result
    (you play every role in turn).
    """
    from turnrl.envs import make
    from turnrl.envs.multiagent import MultiAgentEnv, hot_seat

    input_fn = input_fn or input  # looked up at call time, so a patched builtins.input is honoured
    total, turns, success, result = 0.0, 0, False, "quit"
    with make(env_id, **env_kwargs) as env:
        if isinstance(env, MultiAgentEnv):
            return hot_seat(env, seed, input_fn=input_fn, print_fn=print_fn)
        obs, _ = env.reset(seed=seed)
        print_fn(env.instructions)
        print_fn("(type an action; '?' shows the oracle's next move; 'q' quits)\n")
        print_fn(obs)
        while True:
            try:
                text = input_fn("> ").strip()
            except EOFError:
                break
            if text.lower() in ("q", "quit", "exit"):
                break
            if text == "?":
                try:
                    plan = env.solve()
                except NotImplementedError:
                    plan = None
                print_fn(f"oracle: {plan[0] if plan else 'no plan from here'}")
                continue
            obs, reward, terminated, truncated, info = env.step(text)
            total += reward
            turns += 1
            success = info["success"]
            print_fn(f"\n{obs}\nreward {reward:+.2f} {info['reward_components']}")
            if terminated or truncated:
                result = "terminated" if terminated else f"truncated ({info.get('truncation', 'limit')})"
                print_fn(f"episode over: {result}; return {total:+.2f}; {'success' if success else 'no success'}")
                break
    return {"return": total, "turns": turns, "success": success, "termination": result}
