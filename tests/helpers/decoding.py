"""Small decoding runs shared by the engine and decoder tests: tiny canvases, early stop off."""

GEN, BLOCK = 16, 8
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [23, 24, 25, 26]]


def run(lm, prompts, method, **kw):
    """lm.generate at gen_length GEN, block BLOCK, early stop off, unless `kw` says otherwise."""
    kw.setdefault("gen_length", GEN)
    kw.setdefault("block_length", BLOCK)
    kw.setdefault("early_stop", False)
    return lm.generate(prompts, method=method, **kw)
