"""Data out: a tiny run's trajectories exported as a Hugging Face dataset, and its checkpoints' model cards."""

import json

import datasets
import pytest
import yaml

from turnrl.cli import main
from turnrl.config import load_config
from turnrl.monitor.card import DEFAULT_BASE_MODEL, base_model, model_card
from turnrl.monitor.export import export_demonstrations, export_trajectories
from turnrl.monitor.files import read_jsonl


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer):
    from tests.test_train import _run

    run, _ = _run(tmp_path_factory.mktemp("runs"), tokenizer, ["log.sample_trajectories=3"], "tiny")
    return run


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_the_export_loads_back_with_datasets_and_matches_the_records(run_dir, tmp_path, tokenizer):
    exported = export_trajectories(run_dir, tmp_path / "ds")
    cache = str(tmp_path / "hf-cache")  # datasets caches a local directory by its name: never read another test's rows
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "ds" / "data" / "*.parquet"), cache_dir=cache)["train"]
    records = read_jsonl(run_dir / "trajectories.jsonl")
    turns = [(r, j, t) for r in records for j, t in enumerate(r["turns"])]
    assert len(ds) == len(turns) == exported.turns and exported.trajectories == len(records) == 2 * 3  # 2 steps, 3 each
    keys = {(row["step"], t["seed"]): t["key"] for row in read_jsonl(run_dir / "task_keys.jsonl")
            if row["split"] == "train" for t in row["tasks"]}
    for row, (rec, j, turn) in zip(ds, turns):
        assert (row["step"], row["trajectory"], row["turn"], row["seed"]) == (rec["step"], rec["index"], j, rec["seed"])
        assert row["task_key"] == keys[(rec["step"], rec["seed"])] is not None
        assert row["response_ids"] == turn["response_ids"] and row["logprobs"] == turn["logprobs"]
        assert row["prompt_ids"] == turn["prompt_ids"] and row["observation"] in tokenizer.decode(row["prompt_ids"])
        assert row["loss_mask"] == turn["loss_mask"] and row["token_advantages"] == turn["token_advantages"]
        assert len(row["response_ids"]) == len(row["logprobs"]) == len(row["loss_mask"]) == len(row["token_advantages"])
        assert (row["advantage"], row["reward"], row["trajectory_reward"]) == (turn["advantage"], turn["reward"], rec["reward"])
        assert row["reward_components"] == turn["reward_components"] and row["masked_by"] == turn["masked_by"]
        assert (row["success"], row["termination"], row["response"]) == (rec["success"], rec["termination"], turn["response"])
    assert any(a != 0.0 for row in ds for a in row["token_advantages"])  # real credit, not a column of zeros
    by_directory = datasets.load_dataset(str(tmp_path / "ds"), cache_dir=cache)["train"]  # the card points at the data
    assert by_directory["response_ids"] == ds["response_ids"] and by_directory.features == ds.features
    assert _front_matter((tmp_path / "ds" / "README.md").read_text())["library_name"] == "turnrl"


def test_export_refuses_a_non_empty_out_and_a_directory_without_records(run_dir, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        export_trajectories(run_dir, tmp_path / "taken")
    with pytest.raises(FileNotFoundError, match="trajectories.jsonl is missing or empty"):
        export_trajectories(tmp_path, tmp_path / "out")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine" and not (tmp_path / "out").exists()


def test_turnrl_export_writes_the_dataset_and_says_where(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir), "--out", str(tmp_path / "ds")]) == 0
    assert str(tmp_path / "ds") in capsys.readouterr().out
    rows = datasets.load_dataset(str(tmp_path / "ds"), cache_dir=str(tmp_path / "hf-cache"))["train"]
    assert len(rows) == len([t for r in read_jsonl(run_dir / "trajectories.jsonl") for t in r["turns"]])
    capsys.readouterr()  # drop datasets' progress bars
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "ds2")]) == 2
    assert capsys.readouterr().err.startswith("error: ") and not (tmp_path / "ds2").exists()


def test_every_checkpoint_carries_a_model_card_with_the_latest_held_out_result(run_dir):
    card = (run_dir / "checkpoints" / "step_000002" / "README.md").read_text()
    front = _front_matter(card)
    last = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/success_rate" in r][-1]
    assert last["step"] == 2
    assert front["library_name"] == "turnrl" and front["env"] == "parity-v0" and "parity-v0" in front["tags"]
    assert front["base_model"] == DEFAULT_BASE_MODEL  # what model.path names (the test passes a tiny model in its place)
    assert front["model-index"][0]["results"][0]["metrics"][0]["value"] == last["eval/success_rate"]
    results = card.split("## Held-out results")[1].split("##")[0]
    assert f"| `parity-v0` | {int(last['eval/distinct_tasks'])} | {last['eval/success_rate']:.3f} |" in results
    assert f"{last['eval/success_ci_low']:.3f} to {last['eval/success_ci_high']:.3f}" in results
    assert "`grpo_turn`" in card.split("## Method")[1]
    config = yaml.safe_load(card.split("```yaml\n")[1].split("```")[0])
    assert config == load_config(run_dir / "config.yaml").model_dump(mode="json")


def test_a_card_before_any_evaluation_says_so_and_names_the_hub_base_model():
    cfg = load_config(None, ["env.id=sokoban-v0", "lora.enabled=true"])
    card = model_card(cfg, "run", 0, None)
    front = _front_matter(card)
    assert front["base_model"] == DEFAULT_BASE_MODEL and "model-index" not in front and "lora" in front["tags"]
    assert "No evaluation had run" in card and "AutoPeftModelForCausalLM" in card


def test_base_model_is_the_hub_id_of_the_default_and_none_for_a_local_directory(tmp_path):
    assert base_model("default") == DEFAULT_BASE_MODEL
    assert base_model("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert base_model(str(tmp_path)) is None
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "default"}))
    assert base_model(str(tmp_path)) == DEFAULT_BASE_MODEL  # a LoRA adapter directory: its base


def test_demonstrations_export_one_row_per_turn_and_load_back(tmp_path):
    from turnrl.agent.demos import write_demos
    from turnrl.types import Termination, Trajectory, Turn

    def turn(s: int, j: int) -> Turn:
        return Turn(prompt_ids=[1, 2, 3 + j], response_ids=[7, 8 + s, 2], logprobs=[0.0] * 3, observation=f"obs {j}",
                    response_text="Down", actions=["down"], reward=float(j))

    demos = [Trajectory(env_id="frozenlake-v0", seed=s, task_key=f"map{s}", success=True,
                        termination=Termination.TERMINATED, turns=[turn(s, j) for j in range(2)]) for s in range(3)]
    path = write_demos(tmp_path / "demos.jsonl", demos, "oracle", vocab_size=49152)
    assert main(["export", str(path), "--out", str(tmp_path / "ds")]) == 0
    ds = datasets.load_dataset(str(tmp_path / "ds"), cache_dir=str(tmp_path / "hf-cache"))["train"]
    assert len(ds) == 6 and ds["trajectory"] == [0, 0, 1, 1, 2, 2] and ds["turn"] == [0, 1] * 3
    assert ds["prompt_ids"][3] == [1, 2, 4] and ds["response_ids"][4] == [7, 10, 2] and ds["loss_mask"][4] == [1, 1, 1]
    assert ds["task_key"][5] == "map2" and ds["source"][0] == "oracle" and ds["reward"][:2] == [0.0, 1.0]
    assert _front_matter((tmp_path / "ds" / "README.md").read_text())["tags"][2] == "demonstrations"
    (tmp_path / "not_demos.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(FileNotFoundError, match="not a demonstration file"):
        export_demonstrations(tmp_path / "not_demos.jsonl", tmp_path / "out")
