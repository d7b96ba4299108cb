"""`caidllm bench`'s settings (BenchConfig): the run's model, tasks, methods and lengths, checked before
anything loads, and what each method's row decodes with (its preset, a settings file's values, the
uniform-state rows' knobs); resolve_lengths fills the unset lengths as generate takes them."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from caidllm.bench.prefix_rows import expand_rows
from caidllm.bench.uniform_rows import check_set_values, row_values
from caidllm.decode.diffusiongemma_settings import UNIFORM_METHODS, build_settings
from caidllm.decode.methods import method_names
from caidllm.decode.nemotron import SEQUENTIAL_METHODS, SequentialSettings
from caidllm.decode.prefix_reuse import check_budget
from caidllm.decode.presets import build_config, run_lengths
from caidllm.decode.uniform_api import with_settings_file
from caidllm.errors import InputError


@dataclass
class BenchConfig:
    """One `caidllm bench` run: model, tasks, methods, decoding sizes, output folder."""

    model: str = "tiny"
    tasks: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=lambda: ["vanilla", "fastdllm", "cai"])
    limit: int | None = None
    batch_size: int = 8
    # None: as generate takes them for the first method (presets.config_for_model), for every method.
    gen_length: int | None = None
    block_length: int | None = None
    data_dir: str | None = None
    out: str | None = None
    device: str | None = None
    dtype: str | None = None
    early_stop: bool = True
    seed: int = 0
    temperature: float = 0.0
    fewshot: int = 0
    chat: bool = True
    warmup: bool = True
    progress: bool | None = None  # None: only when stderr is a terminal
    code_timeout: float = 10.0
    compile: bool = False
    quantize: str | None = None  # torchao quantized linear layers (models/quantize.py)
    quantize_head: bool = False
    # A settings file (caidllm calibrate): its values run as one more method row, named by the file
    # ("cai-calibrated"), beside the presets listed (appended if --methods does not name it).
    settings_file: str | None = None
    # The prefix store's budgets (bench/prefix_rows.py): (None,) = the default; several = one row per
    # method and budget, named by both.
    prefix_cache_mb: tuple = (None,)
    # --set NAME=VALUE of the uniform-state decoders' rows (bench/uniform_rows.py), OWNER.FIELD nested
    set_values: dict = field(default_factory=dict)
    _loaded: object = field(default=None, init=False, repr=False, compare=False)
    _rows: dict | None = field(default=None, init=False, repr=False, compare=False)

    def loaded_settings(self):
        if self.settings_file is not None and self._loaded is None:
            from caidllm.decode.settings_file import load_settings

            self._loaded = load_settings(self.settings_file)
        return self._loaded

    def method_options(self, method: str) -> tuple[str, dict]:
        """(preset, extra generate() keywords) of a method row."""
        method = (self._rows or {}).get(method, (method, None))[0]
        loaded = self.loaded_settings()
        if loaded is not None and method == loaded.name:
            return loaded.method, {"settings": loaded}
        return method, {}

    def lengths_for(self, method: str) -> dict:
        """gen_length and block_length as a method row takes them (presets.run_lengths): the run's block
        length goes to the methods that lay blocks, not to Elastic-Cache's official loop (one block of
        gen_length; its row's block_length and the report's note say so)."""
        if self.method_options(method)[0] in UNIFORM_METHODS:  # a run of them only: the canvas is the block
            return dict(gen_length=self.gen_length, block_length=self.block_length)
        rows = [self.method_options(m) for m in self.methods]
        return run_lengths(rows, self.gen_length, self.block_length)[self.methods.index(method)]

    def generate_options(self, method: str) -> dict:
        """The generate() keywords of a method row (beside the prompts, batch size and chat): a uniform-state
        decoder (DiffusionGemma's) takes its method, gen_length and seed; a mask-based one the preset, its
        settings, the prefix store, the lengths, temperature, seed and early stop."""
        preset, extra = self.method_options(method)
        if preset in UNIFORM_METHODS:  # a settings file's row: the file under the --set values
            return {
                "method": preset,
                "gen_length": self.gen_length,
                "seed": self.seed,
                **extra,
                **row_values(preset, self.set_values, self.early_stop),
            }
        return {
            "method": preset,
            **extra,
            **self.store_options(method),
            **self.lengths_for(method),
            "temperature": self.temperature,
            "seed": self.seed,
            "early_stop": self.early_stop,
        }

    def row_config(self, method: str):
        """A row's decode config: a DecodeConfig, or a uniform-state decoder's DiffusionGemmaSettings."""
        preset, extra = self.method_options(method)
        if preset in UNIFORM_METHODS:
            values = with_settings_file(
                None, preset, {**extra, **row_values(preset, self.set_values, self.early_stop)}
            )
            return build_settings(preset, gen_length=self.gen_length, seed=self.seed, **values)
        # decode/nemotron.py's settings (checked against the model by generate)
        if preset in SEQUENTIAL_METHODS:
            return SequentialSettings(method=preset, **self.lengths_for(method))
        return build_config(preset, **extra, **self.lengths_for(method))

    def store_options(self, row: str) -> dict:
        """The prefix store's generate() keyword of a row (none: the default budget)."""
        budget = (self._rows or {}).get(row, (row, self.prefix_cache_mb[0]))[1]
        return {} if budget is None else {"prefix_cache_mb": budget}

    def check(self) -> None:
        if not self.tasks:
            raise InputError("no task given; pass --task at least once (e.g. --task synthetic:arithmetic)")
        if not self.methods:
            raise InputError(f"no method given; choose from {', '.join(method_names())}")
        known = [*method_names(), *UNIFORM_METHODS, *SEQUENTIAL_METHODS]  # the own decoders checked later
        loaded = self.loaded_settings()
        if loaded is not None:
            if loaded.name in known:
                raise InputError(
                    f"settings file {self.settings_file}: its name {loaded.name!r} is a preset's; "
                    'give it another "name"'
                )
            if loaded.name not in self.methods:
                self.methods = [*self.methods, loaded.name]
            known = [*known, loaded.name]
        for m in self.methods:
            if m not in known:
                raise InputError(f"unknown method {m!r}; choose from {', '.join(known)}")
        if len(set(self.methods)) != len(self.methods):
            raise InputError(f"methods listed twice in {','.join(self.methods)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise InputError(f"tasks listed twice in {', '.join(self.tasks)}")
        for name in ("limit", "batch_size", "gen_length", "block_length"):
            value = getattr(self, name)
            if name != "batch_size" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if isinstance(self.fewshot, bool) or not isinstance(self.fewshot, int) or self.fewshot < 0:
            raise InputError(f"fewshot must be an integer >= 0, got {self.fewshot!r}")
        if not (isinstance(self.code_timeout, (int, float)) and self.code_timeout > 0):
            raise InputError(f"code-timeout must be a positive number of seconds, got {self.code_timeout!r}")
        check_set_values([self.method_options(m)[0] for m in self.methods], self.set_values)
        # Lengths together once both are known (resolve_lengths fills unset ones against the model).
        both = None not in (self.gen_length, self.block_length)
        for m in self.methods:  # gen/block lengths and temperature checked by the decoder's own validation
            preset, extra = self.method_options(m)
            if preset in UNIFORM_METHODS or preset in SEQUENTIAL_METHODS:  # checked against the model later
                continue
            build_config(
                preset,
                **extra,
                **(self.lengths_for(m) if both else {}),
                temperature=self.temperature,
                early_stop=self.early_stop,
            )
        if not isinstance(self.prefix_cache_mb, (tuple, list)) or not self.prefix_cache_mb:
            raise InputError(
                f"prefix_cache_mb must be a tuple of budgets (MB, or None), got {self.prefix_cache_mb!r}"
            )
        self.prefix_cache_mb = tuple(check_budget(b, "prefix_cache_mb") for b in self.prefix_cache_mb)
        if self._rows is None and len(self.prefix_cache_mb) > 1:  # from here on a "method" is a row
            self._rows = expand_rows(self.methods, self.prefix_cache_mb)
            self.methods = list(self._rows)


def resolve_lengths(settings: BenchConfig, lm=None) -> BenchConfig:
    """The run's lengths (options.lengths_for_run): unset ones as generate takes them for the first
    method; each method checked against the model, from its config.json alone when `lm` is None."""
    from caidllm.options import lengths_for_run

    methods = [settings.method_options(m) for m in settings.methods]
    lengths = lengths_for_run(
        settings.model,
        lm,
        methods,
        settings.gen_length,
        settings.block_length,
        temperature=settings.temperature,
        early_stop=settings.early_stop,
    )
    resolved = copy.copy(settings)  # a copy that keeps what check() derived (the method rows)
    resolved.gen_length, resolved.block_length = lengths["gen_length"], lengths["block_length"]
    return resolved
