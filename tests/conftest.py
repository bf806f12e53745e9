import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Ray's raylet waits this long for its metrics agent; the 30 s default ran out on a loaded 2-core machine
os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tokenizer():
    """The real SmolLM2 tokenizer and chat template (extracted from the embedded GGUF, no weights)."""
    from turnrl.models import load_tokenizer

    return load_tokenizer("default")


@pytest.fixture
def tiny_model(tokenizer):
    from turnrl.models import tiny_model

    return tiny_model(tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """The ``tiny_model`` (seed 0) and the tokenizer saved as a model directory, for ``model.path=`` (read only)."""
    from turnrl.models import tiny_model

    model_dir = tmp_path_factory.mktemp("tiny-model")
    tiny_model(tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir
