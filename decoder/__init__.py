"""specls.decoder: the speculative decode loop, drafters, acceptance and stats. Pure: numpy only.

- ``loop.generate(target, prompt, drafter, settings, eos_ids, cancelled, stop)`` -> DecodeResult
- ``acceptance``: ``greedy_accept``, ``rejection_accept``, ``process_logits``, ``sample``
- ``drafters``: ``PromptLookupDrafter``, ``DraftModelDrafter``, ``DrafterSettings``
- ``planned``: ``PlannedDrafter``, the drafting policy (``policy.plan_pass``) choosing each pass's draft
- ``ngram``: ``NgramIndex`` (incremental, many documents), ``lookup`` across ranked sources
"""
