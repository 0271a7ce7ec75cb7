"""``--engine remote`` next edits against ``specls serve-engine`` in front of the real ``OnnxEngine``
class (fake numpy models): the edit prompt reaches the engine as it is (raw, no FIM around it) and
decodes as the in-process next-edit path decodes it (greedy: the same tokens)."""

from __future__ import annotations

from specls.api import NextEditRequest
from specls.next_edit.edit_diff import diffs_between
from specls.next_edit.layouts import get_layout
from specls.next_edit.request_prompt import render_edit
from specls.next_edit.settings import NextEditSettings
from specls.team.remote import RemoteEngine, RemoteSettings
from specls.team.serve_engine import EngineHTTPServer, ServeEngineSettings
from tests.specls.fakes import SOURCE
from tests.team.test_onnx_engine_team import fake_engine


def test_remote_next_edit_decodes_the_edit_prompt_as_the_engine_does() -> None:
    engine = fake_engine(lru_size=0)
    server = EngineHTTPServer(ServeEngineSettings(port=0), engine).start()
    try:
        before = SOURCE.replace("total = 0", "total = 1", 1)
        request = NextEditRequest(
            "file:///w/a.py", SOURCE, 2, 0, tuple(diffs_between("/w/a.py", before, SOURCE)), layout="sweep"
        )
        remote = RemoteEngine(RemoteSettings(base_url=server.url, stream=False, cache_size=0))
        remote.load()
        remote.next_edit(request)
        prompt = render_edit(request, get_layout("sweep"), NextEditSettings()).prompt
        assert engine.last_prompt == engine.models.tokenizer.encode(prompt)  # no FIM template around it
        remote_tokens = list(engine.last_tokens)
        local = fake_engine(lru_size=0)
        local.next_edit(request)
        assert local.edits is not None and local.edits.last_prompt == engine.last_prompt
        n = min(len(remote_tokens), len(local.edits.last_tokens))
        assert n > 0 and remote_tokens[:n] == local.edits.last_tokens[:n]
    finally:
        server.close()
