"""Small decoding runs shared by the engine and decoder tests: tiny canvases, early stop off."""

GEN, BLOCK = 16, 8
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [23, 24, 25, 26]]


def block_of(method, **kw):
    """BLOCK, or None for a method that lays no blocks (Elastic-Cache's official loop refuses a block
    length other than gen_length): `kw`'s decoding settings decide, the rest (batch_size, ...) aside."""
    from caidllm.decode.presets import lays_blocks
    from caidllm.decode.setting_names import ALL_NAMES

    settings = {k: v for k, v in kw.items() if k in ALL_NAMES}
    return BLOCK if lays_blocks(method or "cai", **settings) else None


def run(lm, prompts, method, **kw):
    """lm.generate at gen_length GEN, block BLOCK (none to a method that lays no blocks: block_of), early
    stop off, unless `kw` says otherwise."""
    kw.setdefault("gen_length", GEN)
    kw.setdefault("block_length", block_of(method, **kw))
    kw.setdefault("early_stop", False)
    return lm.generate(prompts, method=method, **kw)


def _finished(engine):
    return {e.request_id: e.result for e in engine.run() if e.finished}


def alone_static_joined(lm, config, prompts):
    """Each prompt's tokens decoded alone, in one static batch, and with all but the last joining a
    running batch mid-flight (after the last one's first two steps): three lists in prompt order."""
    from caidllm.decode.engine import Engine

    alone = []
    for prompt in prompts:
        engine = Engine(lm, max_batch=1)
        rid = engine.submit(prompt, config)
        alone.append(_finished(engine)[rid].token_ids)
    engine = Engine(lm, max_batch=len(prompts) + 1)
    ids = [engine.submit(p, config) for p in prompts]
    static = _finished(engine)
    engine = Engine(lm, max_batch=len(prompts) + 1)
    first = engine.submit(prompts[-1], config)
    engine.step()
    engine.step()
    late = [engine.submit(p, config) for p in prompts[:-1]]  # join mid-flight, at other blocks
    joined = _finished(engine)
    return alone, [static[i].token_ids for i in ids], [joined[i].token_ids for i in late + [first]]


def lm_eval_generates(pretrained, **options) -> bool:
    """caidllm's lm-eval adapter answers two generate_until requests with strings."""
    from lm_eval.api.instance import Instance

    from caidllm.evaluation.lm_eval_adapter import CaidllmLM

    adapter = CaidllmLM(pretrained=str(pretrained), batch_size=2, device="cpu", **options)
    requests = [
        Instance(request_type="generate_until", doc={}, arguments=(q, {"until": []}), idx=i)
        for i, q in enumerate(["What is 2 + 2?", "Say yes."])
    ]
    return all(isinstance(a, str) for a in adapter.generate_until(requests))
