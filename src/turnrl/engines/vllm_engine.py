"""A vLLM engine (in process, GPU) behind the engine protocol, with in-place weight updates from the learner.

Install with ``pip install 'turnrl[vllm]'`` (vLLM >= 0.10.2, for ``logprobs_mode``); ``bench/gpu_check.sh``
checks it against :class:`~turnrl.engines.HFEngine` on a GPU machine.

What it does and how it maps onto vLLM's offline API (``vllm.LLM``):

- **Token ids in.** Each prompt is a ``TokensPrompt(prompt_token_ids=ids)``: vLLM conditions on exactly
  the collector's ids, no re-tokenisation.
- **Token ids and behaviour logprobs out.** Each request asks for ``logprobs=0`` (the sampled token's
  logprob only); ``CompletionOutput.logprobs[j][token_ids[j]].logprob`` is turnrl's ``logprobs[j]``.
  By default vLLM reports *raw* logprobs (``logprobs_mode="raw_logprobs"``: ``log_softmax(logits)`` before
  temperature). turnrl's convention is ``log_softmax(logits / temperature)``, which is what the learner
  recomputes, so this engine builds the LLM with ``logprobs_mode="processed_logprobs"`` (after
  temperature, penalties and top-k/top-p) and refuses an LLM built otherwise. The two conventions agree
  exactly for greedy decoding (vLLM divides by 1 when temperature is 0) and whenever top_p=1 and top_k=0
  (turnrl's defaults). With top-k/top-p, vLLM's processed logprob is renormalised over the kept tokens,
  while turnrl's is not; the difference is the log of the kept mass. (vLLM's other modes: ``raw_logits``,
  ``processed_logits`` return logits, not logprobs.)
- **Stops.** ``stop_token_ids`` and ``stop_strings`` go to vLLM as ``stop_token_ids`` and ``stop`` with
  ``include_stop_str_in_output=True``, so as in the HF engine the tokens that completed a stop string are
  kept. vLLM also stops at the model's own end-of-sequence ids (its generation config), which may be more
  ids than the tokenizer's single ``eos_token_id`` the HF engine uses.
- **Seeds.** Every request carries its own ``seed``, drawn in input order from the engine's seeded
  stream, so a row's tokens do not depend on which rows share its batch, and
  :meth:`state_dict` / :meth:`load_state_dict` make a resumed run draw the same seeds.
- **Order.** ``LLM.generate`` returns outputs in input order; the engine checks the count.
- **Weights.** :meth:`sync_weights` sends the learner's ``state_dict()`` (Hugging Face parameter names, which
  vLLM's ``model.load_weights`` maps onto its fused layers) into the running model, in place, then resets
  vLLM's prefix cache (its cached KV was computed with the old weights) and bumps ``version``. In process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which this engine sets when it builds the LLM) the tensors are
  loaded directly; with a multiprocess engine they go through ``LLM.collective_rpc``, which pickles them
  and needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``.
- **Sleep.** With ``enable_sleep_mode=True``, :meth:`sleep` frees GPU memory between rollouts (level 1
  offloads weights to CPU, level 2 drops them: sync after :meth:`wake_up`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable
from typing import Any

from turnrl.engines.base import Completion, SamplingParams, SeedStreamState

REQUIRED_LOGPROBS_MODE = "processed_logprobs"


def import_vllm():
    """The ``vllm`` module, or an ImportError naming the extra that installs it."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            f"VLLMEngine needs vLLM ({e}); install it with: pip install 'turnrl[vllm]' (a CUDA machine; see "
            "bench/gpu_check.sh)"
        ) from e
    return vllm


def _load_weights_on_worker(worker, weights: list[tuple[str, Any]]) -> int:
    """Runs inside each vLLM worker via ``collective_rpc``: load named tensors into its model."""
    loaded = worker.model_runner.model.load_weights(weights=weights)
    return len(loaded) if loaded is not None else len(weights)


class VLLMEngine(SeedStreamState):
    """Engine protocol over ``vllm.LLM``; see the module docstring for every mapping.

    Pass a built ``llm`` (it must use ``logprobs_mode="processed_logprobs"``), or ``model`` (``"default"``
    or a local HF directory) and any ``vllm.LLM`` keyword in ``llm_kwargs`` (``gpu_memory_utilization``,
    ``dtype``, ``enable_sleep_mode``, ...). ``learner_model`` is the torch module whose weights
    :meth:`sync_weights` copies in; ``weights`` overrides it with any callable returning
    ``(name, tensor)`` pairs.
    """

    trainable = True

    def __init__(
        self,
        model: str | None = None,
        *,
        llm: Any = None,
        learner_model: Any = None,
        weights: Callable[[], Iterable[tuple[str, Any]]] | None = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        if llm is None:
            if model is None:
                raise ValueError("pass model= ('default' or a local Hugging Face model directory) or a built llm=")
            # in process, so weights load without pickling; set before vllm is imported (it reads its env then)
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._vllm = import_vllm()
        if llm is None:
            from turnrl.models import resolve_model_path

            llm_kwargs.setdefault("logprobs_mode", REQUIRED_LOGPROBS_MODE)
            llm_kwargs.setdefault("seed", seed)
            llm = self._vllm.LLM(model=str(resolve_model_path(model)), **llm_kwargs)
        elif llm_kwargs:
            raise ValueError(f"llm_kwargs {sorted(llm_kwargs)} only apply when the engine builds the LLM itself")
        _check_logprobs_mode(llm)
        self.llm = llm
        self.learner_model = learner_model
        self.weights = weights
        self.version = 0
        self.rng = random.Random(seed)

    # ---- protocol -------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if not prompts:
            return []
        vllm = self._vllm
        requests = [vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        sampling = [self._sampling_params(params, self.rng.randrange(2**31)) for _ in prompts]
        outputs = self.llm.generate(requests, sampling_params=sampling, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        return [self._completion(o) for o in outputs]

    def sync_weights(self) -> None:
        """Copy the learner's weights into vLLM's model in place; reset the prefix cache; bump ``version``."""
        if self.weights is not None:
            named = list(self.weights())
        elif self.learner_model is not None:
            named = list(self.learner_model.state_dict().items())
        else:
            raise RuntimeError("VLLMEngine.sync_weights has no weights to load: pass learner_model= (the module the "
                               "learner updates) or weights= (a callable returning (name, tensor) pairs)")
        self.load_weights(named)
        self.version += 1

    # ---- weights and memory -----------------------------------------------------------------
    def load_weights(self, named: list[tuple[str, Any]]) -> None:
        """Load ``(hf_name, tensor)`` pairs into the served model, in place, and drop stale cached KV."""
        model = _in_process_model(self.llm)
        if model is not None:
            model.load_weights(weights=named)
        else:
            self.llm.collective_rpc(_load_weights_on_worker, kwargs={"weights": named})
        self.llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory (needs ``enable_sleep_mode=True``): level 1 offloads weights, level 2 drops them."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo :meth:`sleep` (``tags``: e.g. ``["weights"]`` first, then ``["kv_cache"]``)."""
        self.llm.wake_up(tags=tags) if tags is not None else self.llm.wake_up()

    # ---- internals ------------------------------------------------------------------------
    def _sampling_params(self, params: SamplingParams, seed: int):
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,  # 0 = all tokens
            stop=list(params.stop_strings),
            stop_token_ids=list(params.stop_token_ids),
            include_stop_str_in_output=True,
            seed=seed,
            logprobs=0,  # only the sampled token's logprob
        )

    def _completion(self, request_output) -> Completion:
        out = request_output.outputs[0]
        ids = list(out.token_ids)
        if out.logprobs is None or len(out.logprobs) != len(ids):
            raise RuntimeError(
                f"vLLM returned {0 if out.logprobs is None else len(out.logprobs)} logprob entries for {len(ids)} "
                "tokens; the engine asks for logprobs=0 on every request, so this vLLM build does not honour it"
            )
        logprobs = [float(step[t].logprob) for step, t in zip(out.logprobs, ids)]
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a request with {out.finish_reason!r} (aborted?)")
        return Completion(ids, logprobs, out.finish_reason, version=self.version,
                          stats={"stop_reason": getattr(out, "stop_reason", None)})


def _in_process_model(llm):
    """The served ``nn.Module`` when vLLM runs in this process (V0, or V1 without multiprocessing), else None."""
    try:
        return llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    except AttributeError:
        return None


def _check_logprobs_mode(llm) -> None:
    mode = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "logprobs_mode", None)
    if mode is None:
        raise ValueError(
            "cannot read llm.llm_engine.model_config.logprobs_mode; VLLMEngine needs vLLM >= 0.10.2 built with "
            f"logprobs_mode={REQUIRED_LOGPROBS_MODE!r} (pip install 'turnrl[vllm]')"
        )
    mode = getattr(mode, "value", mode)
    if mode != REQUIRED_LOGPROBS_MODE:
        raise ValueError(
            f"the LLM reports logprobs_mode={mode!r}: its logprobs are not the temperature-scaled ones the learner "
            f"recomputes. Build it with vllm.LLM(..., logprobs_mode={REQUIRED_LOGPROBS_MODE!r}) or let VLLMEngine(model=...) "
            "build it"
        )
