"""`turnrl train | sft | eval | serve | play | watch | report | envs | init | export | completion`: argument parsing, printing, exit codes.

`train`, `sft` and `eval` call :mod:`turnrl.api`, the functions Python code calls (``turnrl.train``, ``turnrl.sft``,
``turnrl.evaluate``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from turnrl.completion import COMPLETE_FLAG, SHELLS, complete, script


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="YAML config file (see configs/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-5 rollout.group_size=8")
    p.add_argument("--help-config", nargs="?", const="", metavar="KEY",
                   help="list every config key (or KEY: one key, or a section such as 'algo') with its value after -c "
                        "and the overrides, its default where that differs, and its meaning")


def _add_import_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE before anything else (repeatable), so its register(...) and "
                        "@register_estimator(...) calls run; the current directory is searched after the installed "
                        "packages, e.g. --import myenvs for ./myenvs.py")


def _import_user_code(modules: list[str]) -> None:
    """Import each ``--import`` module, the current directory searchable (last, so a local file never shadows an
    installed module; ``algo.prm`` and ``module:Class`` env ids find local modules the same way)."""
    from turnrl.config import ConfigError

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    for name in modules:
        if name.endswith(".py") or "/" in name:
            dotted = ".".join(p for p in Path(name.removesuffix(".py")).parts if p not in (".", "/"))
            raise ConfigError(f"--import takes a module name as you would import it, not a file: --import {dotted}")
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                raise ConfigError(f"--import {name}: {e} in the installed packages or the current directory ({cwd}); "
                                  "run turnrl from the directory that holds it, or install its project: "
                                  "pip install -e DIR") from None
            raise ConfigError(f"--import {name}: it imports '{e.name}', which is not installed; install it: "
                              f"pip install {e.name}") from None


def _load(args):
    """The command's config, as :func:`turnrl.api.resolve_config` resolves it from ``-c``, the overrides, ``--resume``
    and ``eval --checkpoint``."""
    from turnrl.api import resolve_config

    return resolve_config(args.config, args.overrides, checkpoint=(getattr(args, "checkpoint", None) or [None])[0],
                          resume=getattr(args, "resume", None))


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading / saving bars would break turnrl's own progress bar


def cmd_help_config(args) -> int:
    from turnrl.config import config_help

    key = args.help_config
    if "=" in key:  # `--help-config train.lr=1e-5`: an override, not a key to show
        args.overrides.append(key)
        key = ""
    print(config_help(_load(args), key))
    return 0


def cmd_train(args) -> int:
    from turnrl.api import train

    _quiet_transformers()
    run = train(args.config, *args.overrides, resume=args.resume)
    return _exit_code(run.run_dir) if run.ran else 0  # not ran: the run had finished, and train said how to extend it


def cmd_sft(args) -> int:
    from turnrl.api import sft

    _quiet_transformers()
    run = sft(args.config, *args.overrides)
    if run.before or run.after:
        print(f"held-out success {_success(run.before)} -> {_success(run.after)}")
    print(f"{run.num_demos} demonstrations: {run.run_dir / 'demos.jsonl'}\ncheckpoint: {run.model_path}\n"
          f"next: turnrl train {'-c ' + args.config + ' ' if args.config else ''}model.path={run.model_path} "
          f"train.seed_start={run.next_seed}   # RL on tasks the demonstrations did not show")
    return 0


def _success(m: dict[str, float]) -> str:
    """``0.250 [0.12-0.43]`` of ``eval/*`` metrics, ``-`` when there are none."""
    if not m:
        return "-"
    return f"{m['eval/success_rate']:.3f} [{m['eval/success_ci_low']:.2f}-{m['eval/success_ci_high']:.2f}]"


def _exit_code(run_dir: Path) -> int:
    """0 for a run that ended by itself; 130 / 143 (as a shell reports them) for one a SIGINT / SIGTERM stopped."""
    from turnrl.monitor.files import read_status

    print(f"run directory: {run_dir}")
    status = read_status(run_dir) or {}
    signal_name = (status.get("message") or "").split(" ", 1)[0] if status.get("state") == "stopped" else ""
    return {"SIGINT": 130, "SIGTERM": 143}.get(signal_name, 0)


def cmd_eval(args) -> int:
    from turnrl.api import evaluate
    from turnrl.config import ConfigError

    if args.suite:
        return _eval_suite(args)
    if len(args.checkpoint or []) > 1 or args.base or args.pass_k or args.out:
        raise ConfigError("several --checkpoint, --base, --pass-k and --out are for a transfer matrix: add --suite, e.g. "
                          "turnrl eval --suite configs/suites/transfer.yaml --checkpoint runs/A --checkpoint runs/B")
    _quiet_transformers()
    result = evaluate(args.config, *args.overrides, checkpoint=(args.checkpoint or [None])[0], engine=args.engine,
                      **_remote_engine_options(args))
    print(result)
    if args.json:
        print(json.dumps(result.metrics))
    return 0


def _eval_suite(args) -> int:
    """``turnrl eval --suite``: the transfer matrix (:mod:`turnrl.evalsuite`), printed and written as JSON and markdown
    into ``--out`` (default: the first checkpoint's run directory, else the current directory)."""
    from turnrl.api import run_of
    from turnrl.config import ConfigError
    from turnrl.evalsuite import run_suite

    if args.engine != "hf":
        raise ConfigError(f"--suite evaluates in this process: drop --engine {args.engine} (turnrl eval --suite SUITE "
                          "--checkpoint RUN)")
    _quiet_transformers()
    result = run_suite(args.suite, args.checkpoint or [], base=args.base, config=args.config, overrides=args.overrides,
                       pass_k=args.pass_k)
    run = run_of(Path(args.checkpoint[0])) if args.checkpoint else None
    paths = result.write(Path(args.out) if args.out else run or Path("."))
    print(result.markdown() + f"\nmatrix: {paths[0]} and {paths[1]}")
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0


def _remote_engine_options(args) -> dict:
    """``--engine openai`` options for :func:`turnrl.engines.make_engine` (vLLM needs none)."""
    from turnrl.config import ConfigError

    given = {"timeout": args.timeout, "max_retries": args.max_retries}
    if args.engine != "openai":
        if any(v is not None for v in (*given.values(), args.base_url, args.api_model)):
            raise ConfigError("--base-url, --api-model, --timeout and --max-retries are for a remote server: add "
                              "--engine openai, e.g. turnrl eval --engine openai --base-url http://localhost:8000/v1 "
                              "--api-model ID")
        return {}
    if not args.base_url or not args.api_model:
        raise ConfigError("--engine openai needs --base-url and --api-model (the id the server serves, see GET "
                          "/v1/models): turnrl eval --engine openai --base-url http://localhost:8000/v1 --api-model ID")
    return dict(base_url=args.base_url, api_model=args.api_model, endpoint=args.api_endpoint,
                api_key=os.environ.get(args.api_key_env), vllm_extensions=not args.api_plain, require_logprobs=False,
                **{k: v for k, v in given.items() if v is not None})


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    value = float(text)
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a count >= 0")
    return value


def cmd_serve(args) -> int:
    from turnrl.build import build_server

    _quiet_transformers()
    cfg = _load(args)
    server = build_server(cfg)
    record = cfg.serve.record_file or "not written (serve.record_file='')"
    print(f"serving {cfg.model.path} at {server.url} (OpenAI-compatible, docs/serve.md); closed episodes: {record}; "
          "Ctrl-C stops", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        return 130
    finally:
        server.close()
    return 0


def cmd_play(args) -> int:
    import yaml

    from turnrl.config import ConfigError

    from turnrl.envs.play import play

    kwargs = {}
    for item in args.kwargs:
        if "=" not in item:
            raise ConfigError(f"env argument '{item}' is not key=value, e.g. turnrl play {args.env} slippery=true")
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


def cmd_completion(args) -> int:
    print(script(args.shell), end="")
    return 0


def cmd_envs(args) -> int:
    from turnrl.envs import registered
    from turnrl.envs.registry import discover

    envs = registered()
    width = max(len(k) for k in envs) if envs else 0
    for env_id, desc in sorted(envs.items()):
        print(f"{env_id:<{width}}  {desc}")
    for problem in discover():  # installed env packages that could not be registered
        print(f"warning: {problem}", file=sys.stderr)
    return 0


def cmd_init(args) -> int:
    from turnrl.config import ConfigError
    from turnrl.envs.scaffold import ScaffoldError, write_env_package

    try:
        root = write_env_package(args.name, args.dir)
    except ScaffoldError as e:
        raise ConfigError(str(e)) from None
    print(f"wrote {root}; next: cd {root} && pip install -e . && pytest (then turnrl envs lists {args.name}-v0)")
    return 0


def cmd_export(args) -> int:
    from turnrl.config import ConfigError
    from turnrl.monitor.export import export_demonstrations, export_trajectories

    demos = Path(args.run).is_file()  # a demonstration JSONL (docs/demos.md), else a run directory
    try:
        done = (export_demonstrations if demos else export_trajectories)(args.run, args.out)
    except ImportError as e:  # pyarrow, in the export extra
        raise ConfigError(str(e)) from None
    what = "demonstrations" if demos else "trajectories"
    print(f"exported {done.trajectories} {what} ({done.turns} turns, a row each) to {done.path}\n"
          f"load it: datasets.load_dataset(\"parquet\", data_files=\"{done.path.parent / '*.parquet'}\")")
    return 0


#: What each command's --help ends with (runs/NAME: a run directory, as `turnrl train` prints it).
EXAMPLES = {
    "turnrl": """examples:
  turnrl train                                   # the embedded SmolLM2-135M on FrozenLake (configs/default.yaml)
  turnrl train -c configs/sokoban.yaml train.steps=20
  turnrl eval --checkpoint runs/NAME             # held-out success with a 95% interval
  turnrl watch runs/NAME
  turnrl train --help-config                     # every config key, its default and meaning
  turnrl completion bash                         # TAB completion: source <(turnrl completion bash)
A command's examples: turnrl COMMAND --help. From Python: turnrl.train(...), turnrl.evaluate(...) (docs/api.md).""",
    "train": """examples:
  turnrl train                                   # the default recipe (configs/default.yaml)
  turnrl train -c configs/sokoban.yaml train.steps=20 rollout.group_size=4
  turnrl train train.lr=1e-5 algo.estimator=rloo
  turnrl train lora.enabled=true train.lr=2e-4   # LoRA adapters on frozen base weights (docs/lora.md)
  turnrl train --resume runs/NAME                # continue from the latest checkpoint
  turnrl train --resume runs/NAME train.steps=80 # extend a finished run
  turnrl train --import myenvs env.id=guess-v0   # your own env, registered in ./myenvs.py
  turnrl train --help-config algo                # one section's keys (or one key: --help-config train.lr)""",
    "sft": """examples:
  turnrl sft -c configs/sokoban_sft.yaml         # oracle demonstrations, SFT, held-out eval, a checkpoint
  turnrl sft sft.demos=file sft.demo_file=runs/NAME/demos.jsonl sft.steps=100
  turnrl sft sft.demos=sample sft.attempts=8     # rejection sampling: the model's own successes
Then RL from it: turnrl train -c configs/sokoban_sft.yaml model.path=runs/NAME/checkpoints/step_000050/model
(docs/demos.md; algo.demo_coef=0.1 algo.demo_file=runs/NAME/demos.jsonl keeps an SFT term during RL)""",
    "eval": """examples:
  turnrl eval                                    # the untrained base model on the held-out tasks
  turnrl eval --checkpoint runs/NAME --json      # a run's latest checkpoint, every metric as JSON
  turnrl eval --checkpoint runs/NAME eval.num_tasks=200
  turnrl eval env.id=sokoban-v0 eval.greedy=false
  turnrl eval --engine openai --base-url http://localhost:8000/v1 --api-model MODEL
  turnrl eval --suite configs/suites/transfer.yaml --checkpoint runs/NAME --base --pass-k 4""",
    "serve": """examples:
  turnrl serve                                   # the default model at http://127.0.0.1:8000/v1
  turnrl serve model.path=runs/NAME/checkpoints/step_000040/model serve.port=8001
  turnrl serve serve.port=0 serve.record_file=runs/served.jsonl   # any free port; where closed episodes go
An agent: any OpenAI client with base_url=http://127.0.0.1:8000/v1 and the header X-Turnrl-Session per episode,
then POST /v1/sessions/ID/reward {"reward": 1.0, "success": true}. To train on what agents play: turnrl train
serve.train=true (docs/serve.md).""",
    "play": """examples:
  turnrl play frozenlake-v0 --seed 3
  turnrl play frozenlake-v0 slippery=true size=8
  turnrl play guess-v0 --import myenvs           # your own env, registered in ./myenvs.py""",
    "watch": """examples:
  turnrl watch runs/NAME
  turnrl watch runs/NAME --once                  # print the view once""",
    "report": """examples:
  turnrl report runs/NAME                        # writes runs/NAME/report.html
  turnrl report runs/NAME -o report.html --max-trajectories 50""",
    "envs": """examples:
  turnrl envs
  turnrl envs --import myenvs                    # with the envs that ./myenvs.py registers""",
    "init": """examples:
  turnrl init env number-walk                    # writes ./number-walk/: env class, tests, config, pyproject
  turnrl init env grid-maze --dir ~/envs         # writes ~/envs/grid-maze/
Then: cd number-walk && pip install -e . && pytest; `turnrl envs` lists number-walk-v0 (docs/envs.md).""",
    "export": """examples:
  turnrl export runs/NAME --out runs/NAME/dataset   # Parquet, one row per turn (docs/export.md)
  turnrl export runs/NAME --out ds               # then in Python: datasets.load_dataset("ds")["train"]
  turnrl export runs/SFT/demos.jsonl --out demos  # demonstrations (turnrl sft writes them; docs/demos.md)""",
    "completion": """examples:
  source <(turnrl completion bash)               # in this shell
  turnrl completion bash > ~/.local/share/bash-completion/completions/turnrl
  turnrl completion zsh > ~/.zfunc/_turnrl       # with ~/.zfunc in $fpath, before compinit""",
}


def _parser() -> argparse.ArgumentParser:
    from turnrl.config import FIXED_ON_RESUME, RESUMABLE

    parser = argparse.ArgumentParser(prog="turnrl", description="Reinforcement learning for multi-turn LLM agents",
                                     epilog=EXAMPLES["turnrl"], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = _command(sub, "train", "train a policy (default: the embedded SmolLM2-135M on FrozenLake)")
    _add_config_args(p)
    _add_import_arg(p)
    p.add_argument("--resume", metavar="RUN",
                   help=f"continue the run in this directory from its latest checkpoint, with its own config.yaml. "
                        f"Overrides (and -c FILE's values) may change {', '.join(RESUMABLE)} (not "
                        f"{', '.join(FIXED_ON_RESUME)}); others are refused. Each change is recorded in "
                        f"RUN/config_changes.jsonl and RUN/config.yaml is rewritten. A finished run is extended with "
                        f"train.steps=N")
    p.set_defaults(fn=cmd_train)

    p = _command(sub, "eval", "success rate (with a 95%% interval) of a checkpoint or the base model on held-out seeds")
    _add_config_args(p)
    _add_import_arg(p)
    p.add_argument("--checkpoint", action="append", help="a checkpoint directory or a run directory (its latest "
                   "checkpoint); inside a run, the run's config.yaml is the config unless -c is given. With --suite, "
                   "repeatable: one matrix row each")
    p.add_argument("--suite", help="a suite YAML file (configs/suites/): evaluate on each of its env/difficulty entries "
                                   "and write the transfer matrix (docs/eval_suite.md)")
    p.add_argument("--base", action="store_true", help="--suite: also a row for the untrained model.path")
    p.add_argument("--pass-k", type=_count, default=0, metavar="K",
                   help="--suite: also pass@K, from K sampled episodes per task")
    p.add_argument("--out", metavar="DIR", help="--suite: where suite-NAME.json and suite-NAME.md go (default: the first "
                                                "checkpoint's run directory, else the current directory)")
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
    p.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                   help="openai: seconds one attempt may take for the whole response; a request that times out twice "
                        "fails (the engine's default: 60)")
    p.add_argument("--max-retries", type=_count, metavar="N",
                   help="openai: retries after a connection error, HTTP 429 or 5xx, with exponential backoff; a timed-out "
                        "request is retried once at most (the engine's default: 4)")
    p.set_defaults(fn=cmd_eval)

    p = _command(sub, "sft", "supervised fine-tuning on demonstrations (oracle, a file, or rejection sampling), then "
                             "a checkpoint `turnrl train model.path=...` starts RL from")
    _add_config_args(p)
    _add_import_arg(p)
    p.set_defaults(fn=cmd_sft)

    p = _command(sub, "serve", "an OpenAI-compatible API over the model that records each session's exact tokens "
                               "as a trajectory (docs/serve.md)")
    _add_config_args(p)
    p.set_defaults(fn=cmd_serve)

    p = _command(sub, "play", "play an env yourself in the terminal")
    p.add_argument("env", help="env id, e.g. frozenlake-v0")
    p.add_argument("kwargs", nargs="*", help="env arguments as key=value, e.g. slippery=true")
    p.add_argument("--seed", type=int, default=None)
    _add_import_arg(p)
    p.set_defaults(fn=cmd_play)

    p = _command(sub, "watch", "live terminal view of a run: recent steps, evaluations and alerts")
    p.add_argument("run", help="a run directory")
    p.add_argument("--once", action="store_true", help="print the view once and exit")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    p.set_defaults(fn=cmd_watch)

    p = _command(sub, "report", "write one self-contained HTML file: curves, alerts, config and a token-level "
                                "trajectory viewer")
    p.add_argument("run", help="a run directory")
    p.add_argument("-o", "--output", help="output file (default: RUN/report.html)")
    p.add_argument("--max-trajectories", type=int, default=200,
                   help="embed at most this many trajectories, from evenly spaced steps (default 200)")
    p.set_defaults(fn=cmd_report)

    p = _command(sub, "envs", "list registered environments")
    _add_import_arg(p)
    p.set_defaults(fn=cmd_envs)

    p = _command(sub, "init", "write a new env package that installs with pip and passes its own tests (docs/envs.md)")
    p.add_argument("kind", choices=["env"], help="what to create: env, a package declaring a turnrl.envs entry point")
    p.add_argument("name", help="the env's name, e.g. number-walk: package number-walk, env id number-walk-v0")
    p.add_argument("--dir", default=".", help="the directory to create NAME/ in (default: the current one)")
    p.set_defaults(fn=cmd_init)

    p = _command(sub, "export", "write a run's trajectories or a demonstration file as a Hugging Face dataset "
                 "(Parquet, one row per turn)")
    p.add_argument("run", help="a run directory, or a demonstration JSONL (docs/demos.md)")
    p.add_argument("--out", required=True, help="the dataset directory to create (must not exist, or be empty)")
    p.set_defaults(fn=cmd_export)

    p = _command(sub, "completion", "print a shell completion script (subcommands, options, config keys)")
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(fn=cmd_completion)
    return parser


def _command(sub, name: str, help: str) -> argparse.ArgumentParser:
    """The subcommand ``name``; its ``--help`` ends with its :data:`EXAMPLES`."""
    return sub.add_parser(name, help=help, epilog=EXAMPLES[name], formatter_class=argparse.RawDescriptionHelpFormatter)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    if argv[:1] == [COMPLETE_FLAG]:  # what the completion scripts run at every TAB
        return complete(parser, argv[1:])
    args, extra = parser.parse_known_args(argv)
    trailing = next((name for name in ("overrides", "kwargs") if hasattr(args, name)), None)
    if extra and trailing and not any(x.startswith("-") for x in extra):
        getattr(args, trailing).extend(extra)  # key=value after an option's value (`train a=1 --import m b=2`)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}; the options are in `turnrl {args.cmd} --help`")
    from turnrl.checkpoint import CheckpointError
    from turnrl.config import ConfigError
    from turnrl.engines.openai_compat import RemoteEngineError
    from turnrl.models import ModelNotFoundError
    from turnrl.monitor.monitor import TrainingDiverged

    try:
        _import_user_code(getattr(args, "imports", []))
        if getattr(args, "help_config", None) is not None:
            return cmd_help_config(args)
        return args.fn(args)
    except (ConfigError, ModelNotFoundError, FileNotFoundError, FileExistsError, RemoteEngineError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (TrainingDiverged, TimeoutError) as e:  # the run's files say what happened; the last good checkpoint is intact
        print(f"error: {e}", file=sys.stderr)  # TimeoutError: e.g. served episodes that never came (serve.wait_timeout_s)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the last checkpoint is intact (resume with `turnrl train --resume RUN`)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
