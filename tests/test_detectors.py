"""Each detector fires on a synthetic run with its pathology and stays silent on a healthy run."""

import math

import pytest

from turnrl.monitor.detectors import (
    EntropyCollapse, EnvFailures, GradSpike, InvalidActionExploit, KLBlowup, LengthExplosion, NonFinite, RewardHacking,
    TemplateCollapse, default_detectors,
)


def healthy(step):
    """A run that learns: reward and success rise together, entropy declines gently, lengths stay put."""
    m = {
        "rollout/reward": 0.1 + 0.04 * step, "rollout/success_rate": 0.05 + 0.03 * step,
        "rollout/reward/outcome": 0.05 + 0.03 * step, "rollout/reward/progress": 0.05 + 0.01 * step,
        "rollout/valid_action_rate": min(1.0, 0.8 + 0.01 * step), "rollout/response_tokens": 3.0 + 0.05 * (step % 3),
        "train/entropy": 2.0 * 0.97 ** step, "train/grad_norm": 1.0 + 0.1 * (step % 4), "train/kl": 0.01 * step,
        "train/approx_kl": 0.001, "train/loss": 0.1, "rollout/cross_input_similarity": 0.85 + 0.05 * (step % 3),
    }
    if step % 5 == 0:
        m["eval/success_rate"] = 0.03 * step
    return m


def run(detector, stream):
    return [a for step, m in enumerate(stream) if (a := detector.update(step, m))]


@pytest.mark.parametrize("detector", default_detectors(), ids=lambda d: d.name)
def test_silent_on_a_healthy_run(detector):
    assert run(detector, [healthy(s) for s in range(40)]) == []


def test_non_finite():
    stream = [healthy(s) for s in range(5)]
    stream[3]["train/loss"] = math.nan
    alerts = run(NonFinite(), stream)
    assert [a.step for a in alerts] == [3] and "train/loss" in alerts[0].message


def test_entropy_collapse():
    stream = [dict(healthy(s), **{"train/entropy": 2.0 if s < 5 else 0.001}) for s in range(10)]
    assert [a.step for a in run(EntropyCollapse(), stream)] == [7]


def test_kl_blowup():
    stream = [dict(healthy(s), **{"train/kl": 0.05 if s < 6 else 3.0}) for s in range(8)]
    assert run(KLBlowup(), stream)[0].step == 6


def test_grad_spike():
    stream = [dict(healthy(s), **{"train/grad_norm": 1.0 if s != 8 else 50.0}) for s in range(12)]
    assert [a.step for a in run(GradSpike(), stream)] == [8]


def test_template_collapse():
    stream = [dict(healthy(s), **{"rollout/cross_input_similarity": 0.35 if s < 8 else 1.0}) for s in range(16)]
    alerts = run(TemplateCollapse(), stream)
    assert [a.step for a in alerts] == [12] and alerts[0].evidence["baseline_similarity"] == pytest.approx(0.35)


def test_length_explosion():
    stream = [dict(healthy(s), **{"rollout/response_tokens": 3.0 if s < 6 else 40.0}) for s in range(8)]
    assert run(LengthExplosion(), stream)[0].step == 6


def test_reward_hacking_against_the_trusted_verifier():
    # training reward climbs (a gamed verifier pays) while held-out success stays at 0.1
    stream = []
    for s in range(30):
        m = dict(healthy(s), **{"rollout/reward": 0.1 + 0.1 * s, "rollout/success_rate": 0.9})
        if s % 5 == 0:
            m["eval/success_rate"] = 0.1
        stream.append(m)
    alerts = run(RewardHacking(), stream)
    assert alerts and alerts[0].name == "reward_hacking" and "held-out" in alerts[0].message
    assert alerts[0].step == 10  # the first step with a full window and three flat evaluations


def test_reward_hacking_by_a_side_component():
    stream = [dict(healthy(0), **{"rollout/reward/format": 0.1 * s, "rollout/success_rate": 0.2}) for s in range(12)]
    alerts = run(RewardHacking(), stream)
    assert alerts and "format" in alerts[0].message


def test_invalid_action_exploit():
    stream = [dict(healthy(s), **{"rollout/valid_action_rate": 1.0 - 0.1 * s, "rollout/reward": 0.1 * s}) for s in range(8)]
    assert run(InvalidActionExploit(), stream)


def test_reward_hacking_stays_silent_on_a_healthy_plateau():
    # measured pattern (bench run of the default recipe, steps 27-34): training reward climbs back after a
    # dip while held-out success wobbles at a high level (0.88 -> 0.80 -> 0.86); that is not hacking
    rewards = [0.87, 1.50, 1.63, 1.83, 2.20, 2.12, 2.20, 2.20]
    success = [0.19, 0.62, 0.78, 0.81, 1.00, 0.97, 1.00, 1.00]
    stream = []
    for s in range(30):
        i = max(0, s - 22)
        m = dict(healthy(1), **{"rollout/reward": rewards[i] if s >= 22 else 1.0, "rollout/success_rate": success[i] if s >= 22 else 0.5})
        if s in (20, 25, 30 - 1):
            m["eval/success_rate"] = {20: 0.88, 25: 0.80, 29: 0.86}[s]
        stream.append(m)
    assert run(RewardHacking(), stream) == []


def test_env_failures_fires_when_the_envs_fail_and_again_after_recovery():
    rates = [0.0, 0.0, 0.1, 1.0, 1.0, 1.0, 0.0, 0.0, 0.75]
    stream = [dict(healthy(s), **{"rollout/termination/env_error": r}) for s, r in enumerate(rates)]
    stream[1]["eval/termination/env_error"] = 0.0
    alerts = run(EnvFailures(), stream)
    assert [a.step for a in alerts] == [3, 8] and "rollout/termination/env_error = 1.00" in alerts[0].message


def test_env_failures_watches_evaluations_too():
    stream = [dict(healthy(s), **{"rollout/termination/env_error": 0.0}) for s in range(3)]
    stream[2]["eval/termination/env_error"] = 1.0
    assert [a.step for a in run(EnvFailures(), stream)] == [2]


def _history_stream():
    """Steps that make the windowed detectors fire late: a grad spike at 9, a reward climb against flat evals."""
    stream = []
    for s in range(24):
        m = dict(healthy(s), **{"rollout/reward": 0.1 + 0.1 * s, "rollout/success_rate": 0.9,
                                "train/grad_norm": 50.0 if s == 9 else 1.0,
                                "rollout/cross_input_similarity": 0.35 if s < 8 else 1.0})
        if s % 5 == 0:
            m["eval/success_rate"] = 0.1
        stream.append(m)
    return stream


@pytest.mark.parametrize("cut", [4, 9, 12])
def test_a_detector_restored_from_its_state_dict_continues_exactly(cut):
    """Stop after ``cut`` steps, save every detector's state through torch's safe loader, restore into fresh ones."""
    import io

    import torch

    stream = _history_stream()
    whole = [(a.name, a.step) for d in default_detectors() for a in run(d, stream)]
    assert {"grad_spike", "reward_hacking", "template_collapse"} <= {name for name, _ in whole}
    first = default_detectors()
    alerts = [(a.name, a.step) for d in first for step, m in enumerate(stream[:cut]) if (a := d.update(step, m))]
    buf = io.BytesIO()
    torch.save([d.state_dict() for d in first], buf)
    buf.seek(0)
    second = default_detectors()
    for d, state in zip(second, torch.load(buf, weights_only=True)):
        d.load_state_dict(state)
    alerts += [(a.name, a.step) for d in second for step, m in enumerate(stream) if step >= cut and (a := d.update(step, m))]
    assert sorted(alerts, key=lambda x: (x[1], x[0])) == sorted(whole, key=lambda x: (x[1], x[0]))
