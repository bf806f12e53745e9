"""The ``serve`` config section: the OpenAI-compatible rollout service (``turnrl serve``, ``docs/serve.md``)."""

from __future__ import annotations

from pydantic import Field

from turnrl.config.section import Section


class ServeConfig(Section):
    host: str = Field("127.0.0.1", description="address the rollout service listens on (0.0.0.0: every interface)")
    port: int = Field(8000, ge=0, le=65535, description="port of the rollout service (0: any free port, printed)")
    session_timeout_s: float = Field(
        600.0, gt=0.0, description="an open session with no call for this long is dropped without a reward (never "
        "written or trained on)"
    )
    request_timeout_s: float = Field(
        300.0, gt=0.0, description="how long a request waits for the engine (busy with another request, or closed "
        "while the trainer updates) before it is answered 503"
    )
    record_file: str = Field("served.jsonl", description="JSONL file every closed episode is appended to ('' = none)")
    train: bool = Field(
        False, description="`turnrl train` serves the policy and trains on the episodes agents close through it, "
        "instead of running the env itself (evaluation still runs in process)"
    )
    wait_timeout_s: float = Field(
        1800.0, gt=0.0, description="train: how long one step waits for rollout.tasks_per_step tasks with "
        "rollout.group_size closed episodes each before the run stops with an error"
    )
