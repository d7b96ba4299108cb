"""llama.cpp's convert_hf_to_gguf.py for a random test checkpoint (tests/helpers/checkpoints.py):
its generated tokenizer matches none of the pre-tokenizer hashes the converter knows, so name it
gpt-2 (the weights are what is timed; the vocabulary is padded to the checkpoint's 126464 anyway).

    python benchmarks/llama_cpp/convert_random.py LLAMA_CPP CKPT --outtype f32 --outfile m-f32.gguf
"""

import runpy
import sys

llama_cpp = sys.argv.pop(1)
sys.path[:0] = [llama_cpp + "/gguf-py", llama_cpp]
from conversion.base import TextModel  # noqa: E402 - llama.cpp's own package, found above

TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = "convert_hf_to_gguf.py"
runpy.run_path(llama_cpp + "/convert_hf_to_gguf.py", run_name="__main__")
