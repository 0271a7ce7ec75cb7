"""specls.decoder: the speculative decode loop, drafters, acceptance and stats. Pure: numpy only.

- ``loop.generate(target, prompt, drafter, settings, eos_ids, cancelled, stop)`` -> DecodeResult
- ``acceptance``: ``greedy_accept``, ``rejection_accept``, ``process_logits``, ``sample``
- ``drafters``: ``PromptLookupDrafter``, ``DraftModelDrafter``, ``HybridDrafter``, ``DrafterSettings``
- ``ngram``: ``NgramIndex`` (incremental, many documents), ``lookup`` across ranked sources
- ``gamma``: ``GammaController`` (adaptive gamma, "speculation pays" check)
- ``testing``: ``FakeLM``, ``ScriptedDrafter`` for tests and benchmarks
"""
