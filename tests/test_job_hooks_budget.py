"""The drain budget holds for the prolog's and the epilog's drains (issue 14 part 2, the storm):
a fault on every node drains at most the budget, whichever hook sees it first. Decisions over
FakeBackend here; tests/lab/test_lab_storm.py proves it inside a real Slurm."""
import pytest

from healthcheck.config import Config
from healthcheck.findings import Finding
from .fake_backend import FakeBackend
from healthcheck.actions import gate
from slurm_hooks import drain

OURS = "gpu-hooks: v1 gpu.lost gpu5; GPU 5 lost"


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    monkeypatch.setattr("healthcheck.actions.budget.SETTLE_S", 0.0)


def config(**health):
    return Config.from_document({"health": {"budget_max_nodes": 1, "budget_max_fraction": 0, **health}}, "c.toml")


def lost(gpu=3):
    return Finding(check="gpu.lost", status="fail", action="drain", message=f"GPU {gpu} lost", gpu=gpu)


def backend(*drained_by_us):
    fake = FakeBackend()
    for name in ("gpu1", "gpu2", "gpu3"):
        fake.add_node(name)
    for name in drained_by_us:
        fake.drain(name, OURS)
    return fake


def test_under_the_budget_the_node_is_drained_with_our_reason():
    fake = backend()
    reason, rule = drain.drain_or_refuse(config(), fake, "gpu2", [lost()], [])
    assert reason.startswith("gpu-hooks: v1 gpu.lost gpu3") and rule == "drain"
    assert [call[:2] for call in fake.writes()] == [("drain", "gpu2")]


def test_a_spent_budget_refuses_the_drain_and_says_so(capsys):
    fake = backend("gpu1")
    reason, rule = drain.drain_or_refuse(config(), fake, "gpu2", [lost()], [])
    assert (reason, rule) == (None, gate.BUDGET_RULE)
    assert [call[:2] for call in fake.writes()] == [("drain", "gpu1")]      # only the first one
    err = capsys.readouterr().err
    assert "gpu2: not drained (drain-budget)" in err and "gpu1" in err


def test_admin_drains_do_not_spend_the_budget():
    fake = backend()
    fake.drain("gpu1", "disk replaced, ticket 4711")
    reason, _ = drain.drain_or_refuse(config(), fake, "gpu2", [lost()], [])
    assert reason is not None and fake.node("gpu2").drained


def test_a_disabled_budget_never_refuses():
    fake = backend("gpu1")
    reason, _ = drain.drain_or_refuse(config(budget_enabled=False), fake, "gpu2", [lost()], [])
    assert reason is not None and fake.node("gpu2").drained


def test_a_drain_that_lost_a_race_with_another_node_is_undone(monkeypatch):
    fake = backend()
    real_drain = fake.drain

    def both_at_once(name, reason):
        # gpu1 drained in the same moment (earlier in the ranking: same second, name first)
        fake.now = 1000.0
        real_drain("gpu1", OURS)
        real_drain(name, reason)
    monkeypatch.setattr(fake, "drain", both_at_once)
    monkeypatch.setattr("time.time", lambda: 1001.0)
    reason, rule = drain.drain_or_refuse(config(), fake, "gpu2", [lost()], [])
    assert (reason, rule) == (None, gate.BUDGET_RULE)
    assert fake.node("gpu1").drained and not fake.node("gpu2").drained


def test_slurm_not_answering_the_budget_query_refuses_under_the_one_name(monkeypatch):
    """Slurm not answering is ``slurm-unreachable-fault`` wherever it happens (the node query or
    the budget's), in every hook: the gate has one name for it."""
    fake = backend()
    calls = []

    def nodes():
        calls.append("nodes")
        raise drain_error()
    monkeypatch.setattr(fake, "nodes", nodes)
    reason, rule = drain.drain_or_refuse(config(), fake, "gpu2", [lost()], [])
    assert (reason, rule) == (None, gate.SLURM_UNREACHABLE) and calls == ["nodes"]
    assert not fake.node("gpu2").drained


def drain_error():
    from healthcheck.slurm import SlurmError

    return SlurmError("scontrol show node: Unable to contact slurm controller")


def test_the_prolog_lets_the_job_run_when_the_budget_refuses(monkeypatch, tmp_path, isolated_env):
    """A non-zero prolog exit would drain the node anyway ("Prolog error")."""
    import shutil

    from slurm_hooks import prolog

    from .conftest import SIM_PROFILES, run_cli

    shutil.copytree(SIM_PROFILES, tmp_path / "sim")
    path = tmp_path / "config.toml"
    path.write_text('[paths]\nstate_dir = "state"\n[gpu]\nbackend = "sim"\nprobe_timeout_s = 2.0\n'
                    '[sim]\nprofile = "sim/h100-healthy.toml"\n'
                    '[[nodes]]\nmatch = "gpu[1-3]"\ngpus = 8\ngpu_model = "H100"\nnvlinks_per_gpu = 18\n'
                    '[health]\nbudget_max_nodes = 1\n[records]\naccounting = false\n')
    for key, value in {"SLURM_GPU_HOOKS_CONFIG": str(path), "SLURMD_NODENAME": "gpu2", "SLURM_JOB_ID": "5",
                       "SLURM_JOB_GPUS": "2,3", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}.items():
        isolated_env.setenv(key, value)
    assert run_cli(["sim", "inject", "--config", str(path), "gpu2", "gpu.3.state=lost"]).exit_code == 0
    fake = backend("gpu1")
    monkeypatch.setattr("slurm_hooks.delivery.backend_for", lambda config: fake)
    assert prolog.main([]) == 0
    assert not fake.node("gpu2").drained
    fake.resume("gpu1")
    assert prolog.main([]) == 1
    assert fake.node("gpu2").drained and fake.node("gpu2").reason.startswith("gpu-hooks: v1 gpu.lost gpu3")
