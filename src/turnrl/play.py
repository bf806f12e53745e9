"""`turnrl play ENV`: play an environment yourself in the terminal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def play(env_id: str, seed: int | None = None, *, input_fn: Callable[[str], str] = input,
         print_fn: Callable[..., None] = print, **env_kwargs: Any) -> dict[str, Any]:
    """Interactive loop: type an action (or free text, as a model would); ``?`` asks the oracle, ``q`` quits.

    Returns the episode summary (return, turns, success, termination).
    """
    from turnrl.envs import make

    env = make(env_id, **env_kwargs)
    obs, _ = env.reset(seed=seed)
    print_fn(env.instructions)
    print_fn("(type an action; '?' shows the oracle's next move; 'q' quits)\n")
    print_fn(obs)
    total, turns, result = 0.0, 0, "quit"
    success = False
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
        success = bool(info.get("success"))
        print_fn(f"\n{obs}\nreward {reward:+.2f} {info.get('reward_components', {})}")
        if terminated or truncated:
            result = "terminated" if terminated else f"truncated ({info.get('truncation', 'limit')})"
            print_fn(f"episode over: {result}; return {total:+.2f}; {'success' if success else 'no success'}")
            break
    env.close()
    return {"return": total, "turns": turns, "success": success, "termination": result}
