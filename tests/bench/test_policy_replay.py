"""bench/scripts/policy_replay.py on the bundled pair: ``collect`` records what the real engine decodes,
``replay`` runs the engine on oracle models built from those records and must reproduce it (its own
assertions: same prompt, output on the greedy path), and the cost model's pieces by table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from specls.decoder.policy import PassCosts
from specls.models.loader import bundled_dir

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "scripts" / "policy_replay.py"


@pytest.fixture(scope="module")
def replay_mod() -> ModuleType:
    spec = importlib.util.spec_from_file_location("policy_replay", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["policy_replay"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def test_feed_cost_table(replay_mod: ModuleType) -> None:
    costs = PassCosts((1.0, 1.0, 1.2), step=0.3, catchup=0.05)
    assert replay_mod.feed_cost(1, costs) == pytest.approx(0.3)  # one step
    assert replay_mod.feed_cost(16, costs) == pytest.approx(0.8)  # 16 x catch-up, how calibration measures it
    assert replay_mod.feed_cost(32, costs) == pytest.approx(1.6)
    assert replay_mod.feed_cost(6, costs) == pytest.approx(0.3 + 5 * 0.5 / 15)  # Not 6 x 0.3: interpolated


@pytest.mark.parametrize(
    "rule,want",
    [
        ("recent", 1),  # the last "1 2" continues with 3 9: one token right
        ("best-of-longest", 3),  # the first "1 2" continues with 3 4 5
        ("best-any", 3),
    ],
)
def test_lookup_accept_rules(replay_mod: ModuleType, rule: str, want: int) -> None:
    ctx = [1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 0, 1, 2]
    truth = [3, 4, 5, 7]
    assert replay_mod._lookup_accept(ctx, truth, rule, 2, 2) == want


@pytest.mark.slow
def test_collect_then_replay_reproduces_the_engine(
    replay_mod: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces.json"
    target, draft = str(bundled_dir("target")), str(bundled_dir("draft"))
    common = ["--model", target, "--draft", draft, "--n", "3", "--max-tokens", "16", "--threads", "1"]
    assert replay_mod.main(["collect", *common, "--out", str(traces)]) == 0
    data = json.loads(traces.read_text())
    assert len(data["traces"]) == 3 and data["costs"]["step"] > 0
    for t in data["traces"]:
        assert t["prompt"] and 0 < len(t["greedy"]) <= 16 and t["draft"]  # one view start at least
    capsys.readouterr()
    assert replay_mod.main(["replay", str(traces), "--tasks", "64"]) == 0  # asserts it stays on the path
    rows = {tuple(line.split()[:2]): line.split() for line in capsys.readouterr().out.splitlines()}
    for method in ("lookup", "hybrid"):
        row = rows[("64", method)]
        tokens, tok_per_pass = float(row[2]), float(row[3])
        assert tokens == sum(len(t["greedy"]) for t in data["traces"])  # every greedy token replayed
        assert tok_per_pass >= 1.0
    assert replay_mod.main(["bound", str(traces)]) == 0
    bounds = {line.split()[0]: float(line.split()[2]) for line in capsys.readouterr().out.splitlines()}
    assert 1.0 <= bounds["recent"] <= bounds["best-of-longest"] <= bounds["best-any"]
