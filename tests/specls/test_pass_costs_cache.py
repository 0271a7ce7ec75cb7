"""The per-machine pass-costs cache: measured once per key, read after; a bad file never an error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from specls.decoder.policy import PassCosts

from specls.pass_costs_cache import (
    MAX_ENTRIES,
    PassCostsCache,
    _costs_from,
    costs_key,
    default_path,
    machine_facts,
)

COSTS = PassCosts(verify=(1.0, 1.1, 1.3), step=0.3, catchup=0.02)


class Measure:
    """A ``measure`` callback that counts its calls and returns ``costs``."""

    def __init__(self, costs: PassCosts = COSTS) -> None:
        self.calls = 0
        self.costs = costs

    def __call__(self) -> PassCosts:
        self.calls += 1
        return self.costs


def model_dir(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "model.onnx").write_bytes(b"graph")
    (d / "specls.json").write_text("{}")
    return d


def key_for(target: Path, draft: Path | None = None, threads: int = 1) -> dict[str, object]:
    return costs_key(target, draft, {"threads": threads, "provider": "cpu"}, machine_facts())


def test_measured_once_then_read(tmp_path: Path) -> None:
    t, d = model_dir(tmp_path, "t"), model_dir(tmp_path, "d")
    cache, measure = PassCostsCache(tmp_path / "c" / "pass-costs.json"), Measure()
    assert cache.get_or_measure(key_for(t, d), measure) == COSTS
    assert cache.get_or_measure(key_for(t, d), measure) == COSTS
    assert measure.calls == 1  # Not 2: the second load reads the file
    fresh = PassCostsCache(cache.path)  # another process reading the same file
    assert fresh.get(key_for(t, d)) == COSTS


@pytest.mark.parametrize("change", ["threads", "draft", "file size", "file mtime", "new file"])
def test_another_key_measures_again(tmp_path: Path, change: str) -> None:
    t, d = model_dir(tmp_path, "t"), model_dir(tmp_path, "d")
    cache, measure = PassCostsCache(tmp_path / "pass-costs.json"), Measure()
    cache.get_or_measure(key_for(t, d), measure)
    threads = 1
    draft: Path | None = d
    if change == "threads":
        threads = 2
    elif change == "draft":
        draft = None
    elif change == "file size":
        (t / "model.onnx").write_bytes(b"re-exported graph")
    elif change == "file mtime":
        st = (t / "model.onnx").stat()
        os.utime(t / "model.onnx", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    else:
        (d / "model.onnx.data").write_bytes(b"weights")
    cache.get_or_measure(key_for(t, draft, threads), measure)
    assert measure.calls == 2  # Not 1: the old entry's costs are another pair's, or other settings'


@pytest.mark.parametrize(
    "entry",
    [
        None,
        "costs",
        {"costs": {"verify": [], "step": 0.3, "catchup": 0.01}},  # Not PassCosts(verify=()): nothing measured
        {"costs": {"verify": [1.0, "1.1"], "step": 0.3, "catchup": 0.01}},
        {"costs": {"verify": [1.0, 1.1], "step": True, "catchup": 0.01}},  # Not step 1.0
        {"costs": {"verify": [1.0, float("nan")], "step": 0.3, "catchup": 0.01}},
        {"costs": {"verify": [1.0, 1.1], "step": -0.3, "catchup": 0.01}},
        {"costs": {"verify": [0.0, 1.1], "step": 0.3, "catchup": 0.01}},  # a pass costs something
        {"costs": {"verify": [1.0, 1.1], "step": 0.3}},
    ],
)
def test_invalid_entries_are_not_costs(entry: object) -> None:
    assert _costs_from(entry) is None


def test_valid_entry_round_trips() -> None:
    assert _costs_from({"costs": {"verify": [1, 1.25], "step": 0, "catchup": 0.5}}) == PassCosts(
        verify=(1.0, 1.25), step=0.0, catchup=0.5
    )


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00bad", b"[1, 2]", b'{"entries": 7}'])
def test_corrupt_file_measures_and_rewrites(tmp_path: Path, content: bytes) -> None:
    t = model_dir(tmp_path, "t")
    path = tmp_path / "pass-costs.json"
    path.write_bytes(content)
    cache, measure = PassCostsCache(path), Measure()
    assert cache.get_or_measure(key_for(t), measure) == COSTS
    assert measure.calls == 1
    assert PassCostsCache(path).get(key_for(t)) == COSTS  # the file is whole JSON again


def test_invalid_stored_entry_is_measured_again(tmp_path: Path) -> None:
    t = model_dir(tmp_path, "t")
    cache, measure = PassCostsCache(tmp_path / "pass-costs.json"), Measure()
    cache.put(key_for(t), COSTS)
    data = json.loads(cache.path.read_text())
    for entry in data["entries"].values():
        entry["costs"]["verify"] = [1.0, -5.0]
    cache.path.write_text(json.dumps(data))
    assert cache.get_or_measure(key_for(t), measure) == COSTS
    assert measure.calls == 1


def test_unwritable_cache_still_gives_costs(tmp_path: Path) -> None:
    t = model_dir(tmp_path, "t")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache, measure = PassCostsCache(blocker / "specls" / "pass-costs.json"), Measure()
    assert cache.get_or_measure(key_for(t), measure) == COSTS
    assert cache.get_or_measure(key_for(t), measure) == COSTS
    assert measure.calls == 2  # nothing could be kept, so each load measures
    assert not list(tmp_path.glob(".pass-costs-*"))


def test_oldest_entries_dropped(tmp_path: Path) -> None:
    t = model_dir(tmp_path, "t")
    cache = PassCostsCache(tmp_path / "pass-costs.json")
    for threads in range(MAX_ENTRIES + 3):
        cache.put(key_for(t, threads=threads), COSTS)
    entries = json.loads(cache.path.read_text())["entries"]
    assert len(entries) == MAX_ENTRIES
    assert cache.get(key_for(t, threads=0)) is None  # the first written went first
    assert cache.get(key_for(t, threads=MAX_ENTRIES + 2)) == COSTS


def test_default_path_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_path() == tmp_path / "specls" / "pass-costs.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_path() == Path.home() / ".cache" / "specls" / "pass-costs.json"
