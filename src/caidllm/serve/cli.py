"""`caidllm serve`: load a model once and serve it over HTTP until SIGTERM / SIGINT."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading

from caidllm.decode.methods import method_names
from caidllm.decode.step_policies import DEFAULT_STEP_POLICY, STEP_POLICIES
from caidllm.errors import InputError
from caidllm.serve import replicas
from caidllm.serve.launch import check_api_key, settings_file_of, settings_from  # noqa: F401 - also read from here


def register(sub, name: str) -> None:
    from caidllm.options import add_model_arguments

    p = sub.add_parser(
        name,
        help="serve a model with an OpenAI-compatible HTTP API",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    from caidllm.options import add_tp_argument

    add_model_arguments(p)
    add_tp_argument(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    _add_request_defaults(p)
    _add_limits(p)
    _add_server_options(p)
    replicas.add_arguments(p)
    p.set_defaults(handler=run)


def _add_request_defaults(p: argparse.ArgumentParser) -> None:
    """What a request gets when it does not say: the model id, the method, the lengths."""
    p.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: the folder name)"
    )
    p.add_argument(
        "--method",
        default=None,
        help="default method (default: a known block-diffusion checkpoint's own "
        f"decoder, else cai): {', '.join(method_names())}; on a uniform-state model (DiffusionGemma) "
        "diffusiongemma (its default) or greedy",
    )
    known = " (default: a known checkpoint's recommendation; else {})"
    p.add_argument(
        "--gen-length",
        type=int,
        default=None,
        help="default canvas when a request gives no max_tokens" + known.format(256),
    )
    p.add_argument(
        "--block-length",
        type=int,
        default=None,
        help="default block length"
        + known.format("the method's, a block-diffusion model's own where it does not apply"),
    )


def _add_limits(p: argparse.ArgumentParser) -> None:
    """The bounds of a request and of the queue, and the engine's step policy."""
    p.add_argument(
        "--max-gen-length",
        type=int,
        default=None,
        help="largest canvas a request may ask for (default: the model's context)",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt (default: what fits)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together (rows per forward)")
    p.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting beyond those; past it: HTTP 429"
    )
    p.add_argument(
        "--max-request-time", type=float, default=600.0, help="seconds before a request is cut (504)"
    )
    p.add_argument(
        "--step-policy",
        default=None,
        choices=list(STEP_POLICIES),
        help=f"which forward groups run at each engine step: fair (cheap forwards are not paced by "
        f"expensive ones) or all (every group every step); default {DEFAULT_STEP_POLICY}, all "
        "under --tp (the ranks must choose alike)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="largest request body; a larger one gets 413 before it is read",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        help="seconds to receive a request's whole body; past it: 408",
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        help="on SIGTERM, seconds requests in flight may go on; then each ends with a clean error",
    )


def _add_server_options(p: argparse.ArgumentParser) -> None:
    """Access, the settings file, the prefix store and logging."""
    p.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (or set CAIDLLM_API_KEY)"
    )
    p.add_argument(
        "--settings",
        default=None,
        metavar="FILE",
        help="settings file (caidllm calibrate, or by hand): the defaults of requests for its method",
    )
    p.add_argument(
        "--prefix-cache-mb",
        default=None,
        metavar="MB",
        help="block-causal models: the prefix store's budget, shared prompt blocks (system prompts, chat "
        "history) computed once (0 = off; default: 1024 MB or an eighth of the device's memory)",
    )
    p.add_argument("--log-level", default="info")


def run(args) -> int:
    from caidllm.decode.prefix_reuse import check_budget
    from caidllm.decode.uniform_api import defaults_file, refuse_on_mask_model
    from caidllm.models.families import get_family
    from caidllm.options import check_before_load, load_model, model_config_of

    # a budget that is not a number of MB, before anything
    check_budget(args.prefix_cache_mb, "--prefix-cache-mb")
    if replicas.wanted(args):  # N replicas on Ray Serve (serve/replicas.py)
        return run_replicas(args)
    # A bad setting, settings file or API key fails before the model loads (checked against its config.json).
    settings = settings_file_of(args)
    check_api_key(args)
    method = args.method or ("cai" if settings is not None else None)  # as settings_from takes it
    # A uniform-state model (DiffusionGemma) takes a settings file of its CAI decoder: the file's method is
    # the default, and the file is checked against the decoder (a mask-based method's refused by name).
    family = model_config_of(args.model)[0].family
    uniform = get_family(family).uniform
    if uniform:
        method = args.method or (settings.method if settings is not None else None)
    else:
        refuse_on_mask_model(family, settings)
    decoded = check_before_load(
        args.model,
        method,
        gen_length=args.gen_length,
        block_length=args.block_length,
        **({"settings": defaults_file(family, method, settings)} if uniform else {}),
    )
    from caidllm.parallel.launch import check_method, check_parallel

    check_parallel(args, args.tp)  # --tp and --tp-timeout, before any rank starts
    if args.tp > 1:  # a step policy or method the ranks cannot run alike, before they start
        from caidllm.decode.engine import step_policy_for

        step_policy_for(args.step_policy, tensor_parallel=True)
        check_method(decoded, args.tp)
    if args.tp > 1:  # this process is rank 0 (the HTTP server, the engine) of the ranks it spawns
        serve_parallel(args)
    else:
        serve_model(args, load_model(args))
    # All has stopped cleanly. The interpreter's teardown of torch and the model would take seconds
    # more on a loaded machine (measured: 2 s, past the grace period); there is nothing left to save.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve_parallel(args) -> None:
    """Serve with --tp: a rank that failed stopped the server (its requests got a 5xx); exit 2 with one
    line naming it, without the interpreter's teardown (as a clean stop)."""
    from caidllm.errors import RankFailure
    from caidllm.parallel.launch import parallel_model

    try:
        with parallel_model(args, args.tp) as lm:
            serve_model(args, lm)
            lm.tp_ranks.raise_failure()
    except RankFailure as error:
        logging.shutdown()
        print(f"caidllm: error: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)


def serve_model(args, lm) -> None:
    """Serve `lm` until SIGTERM / SIGINT (or, with --tp, a rank failing)."""
    import uvicorn

    from caidllm.serve.app import create_app
    from caidllm.serve.shutdown import uvicorn_config

    app = create_app(lm, settings_from(args, lm), engine_thread=False)
    background = app.state.background
    # HTTP in a thread, the engine loop in the main thread (BENCHMARKS.md: "Where the engine loop runs").
    # SIGTERM / SIGINT: the app drains (serve/shutdown.py) with the listener open: new requests get 503,
    # requests in flight go on for --shutdown-grace seconds (a second signal: no longer), then end with
    # a clean error; then uvicorn stops, the app shuts down, the engine stops, and the exit status is 0.
    server = uvicorn.Server(uvicorn_config(app, args.host, args.port, args.log_level, args.shutdown_grace))
    http = threading.Thread(target=server.run, name="caidllm-http")

    def stop_http():
        server.should_exit = True

    app.state.shutdown.on_expired = stop_http

    def on_signal(signum=None, frame=None):
        if getattr(lm, "tp_ranks", None) is not None:
            lm.tp_ranks.phase = "draining"  # what a rank failing from now on is said to interrupt
        app.state.shutdown.begin_from_thread()

    def on_rank_failure(verdict: str):  # nothing can decode any more: refuse, fail what is in flight, stop
        app.state.shutdown.fail_from_thread(verdict)

    def stop_engine_after_http():
        http.join()
        background.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if getattr(lm, "tp_ranks", None) is not None:
        lm.tp_ranks.on_failure = on_rank_failure
    # What is loaded now lives as long as the process: the collector skips it from here on (at exit
    # too, where scanning the imports' and the model's objects once took seconds past the grace period).
    gc.freeze()
    http.start()
    threading.Thread(target=stop_engine_after_http, daemon=True).start()
    background.run_here()
    http.join()
    if not server.started:
        raise InputError(f"the server could not start on {args.host}:{args.port} (see the log above)")


def run_replicas(args) -> int:
    replicas.check(args)
    try:
        from caidllm.serve import ray_deployment
    except ImportError as e:
        raise InputError(
            f"--replicas needs Ray Serve ({e.name or e} is missing): pip install 'caidllm[ray]'"
        ) from None
    return ray_deployment.serve_until_stopped(args)
