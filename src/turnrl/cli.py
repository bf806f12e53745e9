"""`turnrl train | eval | play | watch | report | envs`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="YAML config file (see configs/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-5 rollout.group_size=8")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")


def _load(args):
    from turnrl.config import load_config

    return load_config(args.config, args.overrides)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading / saving bars would break turnrl's own progress bar


def cmd_train(args) -> int:
    from turnrl.train import train

    _quiet_transformers()

    if args.resume:
        from turnrl.config import load_config

        run = Path(args.resume)
        if not (run / "config.yaml").exists():
            raise FileNotFoundError(f"{run} is not a run directory (no config.yaml); pass the directory `turnrl train` printed")
        cfg = load_config(run / "config.yaml", args.overrides)
        run_dir = train(cfg, resume=run)
    else:
        cfg = _load(args)
        run_dir = train(cfg)
    print(f"run directory: {run_dir}")
    return 0


def cmd_eval(args) -> int:
    from turnrl.build import build, build_for_eval
    from turnrl.train import evaluate

    _quiet_transformers()

    cfg = _load(args)
    if args.checkpoint:
        ckpt = Path(args.checkpoint)
        if (ckpt / "checkpoints" / "latest").exists():  # a run directory: take its latest checkpoint
            from turnrl.checkpoint import latest_checkpoint

            ckpt = latest_checkpoint(ckpt)
        model_dir = ckpt / "model" if (ckpt / "model").exists() else ckpt
        cfg.model.path = str(model_dir)
    c = build(cfg) if args.engine == "hf" else build_for_eval(cfg, args.engine, **_remote_engine_options(args))
    m = evaluate(c)
    rate, lo, hi = m["eval/success_rate"], m["eval/success_ci_low"], m["eval/success_ci_high"]
    print(f"{cfg.env.id}: success {rate:.3f} (95% CI {lo:.3f}-{hi:.3f}) over {int(m['eval/num_tasks'])} held-out tasks; "
          f"valid actions {m['eval/valid_action_rate']:.3f}")
    if args.json:
        print(json.dumps(m))
    return 0


def _remote_engine_options(args) -> dict:
    """``--engine openai`` options for :func:`turnrl.engines.make_engine` (vLLM needs none)."""
    if args.engine != "openai":
        return {}
    import os

    from turnrl.config import ConfigError

    if not args.base_url or not args.api_model:
        raise ConfigError("--engine openai needs --base-url (e.g. http://localhost:8000/v1) and --api-model "
                          "(the id the server serves, see GET /v1/models)")
    if args.checkpoint:
        raise ConfigError("--checkpoint cannot be sent to a remote server; serve the checkpoint there and pass --api-model")
    return dict(base_url=args.base_url, api_model=args.api_model, endpoint=args.api_endpoint,
                api_key=os.environ.get(args.api_key_env), vllm_extensions=not args.api_plain, require_logprobs=False)


def cmd_play(args) -> int:
    import yaml

    from turnrl.config import ConfigError

    from turnrl.envs.play import play

    kwargs = {}
    for item in args.kwargs:
        if "=" not in item:
            raise ConfigError(f"env argument '{item}' is not key=value (example: slippery=true)")
        k, v = item.split("=", 1)
        kwargs[k] = yaml.safe_load(v)
    from turnrl.envs import UnknownEnvError

    try:
        play(args.env, seed=args.seed, **kwargs)
    except (UnknownEnvError, TypeError, ValueError, ImportError) as e:  # ImportError: an adapter's optional package
        raise ConfigError(str(e)) from None
    return 0


def cmd_watch(args) -> int:
    from turnrl.monitor.watch import watch

    watch(Path(args.run), once=args.once, interval=args.interval)
    return 0


def cmd_report(args) -> int:
    from turnrl.monitor.report import write_report

    out = write_report(Path(args.run), Path(args.output) if args.output else None, max_trajectories=args.max_trajectories)
    print(f"report: {out}")
    return 0


def cmd_envs(args) -> int:
    from turnrl.envs import registered

    envs = registered()
    width = max(len(k) for k in envs) if envs else 0
    for env_id, desc in sorted(envs.items()):
        print(f"{env_id:<{width}}  {desc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="turnrl", description="Reinforcement learning for multi-turn LLM agents")
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("train", help="train a policy (default: the embedded SmolLM2-135M on FrozenLake)")
    _add_config_args(p)
    p.add_argument("--resume", metavar="RUN", help="continue the run in this run directory from its latest checkpoint")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("eval", help="success rate (with a 95%% interval) of a checkpoint or the base model on held-out seeds")
    _add_config_args(p)
    p.add_argument("--checkpoint", help="a checkpoint directory or a run directory (its latest checkpoint)")
    p.add_argument("--json", action="store_true", help="also print every eval metric as JSON")
    p.add_argument("--engine", choices=["hf", "vllm", "openai"], default="hf",
                   help="hf: in process (default); vllm: turnrl[vllm] on a GPU; openai: a remote OpenAI-compatible server "
                        "(docs/engines.md)")
    p.add_argument("--base-url", help="openai: server URL, e.g. http://localhost:8000/v1")
    p.add_argument("--api-model", help="openai: the served model id")
    p.add_argument("--api-endpoint", choices=["completions", "chat"], default="completions",
                   help="openai: /v1/completions with exact prompt ids (default) or /v1/chat/completions with messages")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="openai: environment variable holding the API key")
    p.add_argument("--api-plain", action="store_true",
                   help="openai: send only standard OpenAI fields (no vLLM extensions such as token-id outputs)")
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("play", help="play an env yourself in the terminal")
    p.add_argument("env", help="env id, e.g. frozenlake-v0")
    p.add_argument("kwargs", nargs="*", help="env arguments as key=value, e.g. slippery=true")
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(fn=cmd_play)

    p = sub.add_parser("watch", help="live terminal view of a run: recent steps, evaluations and alerts")
    p.add_argument("run", help="a run directory")
    p.add_argument("--once", action="store_true", help="print the view once and exit")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    p.set_defaults(fn=cmd_watch)

    p = sub.add_parser("report", help="write one self-contained HTML file: curves, alerts, config and a token-level "
                                      "trajectory viewer")
    p.add_argument("run", help="a run directory")
    p.add_argument("-o", "--output", help="output file (default: RUN/report.html)")
    p.add_argument("--max-trajectories", type=int, default=200,
                   help="embed at most this many trajectories, from evenly spaced steps (default 200)")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("envs", help="list registered environments")
    p.set_defaults(fn=cmd_envs)

    args = parser.parse_args(argv)
    if getattr(args, "help_config", False):
        from turnrl.config import config_help

        print(config_help())
        return 0
    from turnrl.config import ConfigError
    from turnrl.engines.openai_compat import RemoteEngineError
    from turnrl.models import ModelNotFoundError

    try:
        return args.fn(args)
    except (ConfigError, ModelNotFoundError, FileNotFoundError, FileExistsError, RemoteEngineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; the last checkpoint is intact (resume with `turnrl train --resume RUN`)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
