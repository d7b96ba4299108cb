"""`caidllm serve`: load a model once and serve it over HTTP until SIGTERM / SIGINT."""

from __future__ import annotations

import argparse
import signal
import threading

from caidllm.decode.presets import method_names
from caidllm.errors import InputError
from caidllm.serve import replicas
from caidllm.serve.launch import settings_file_of, settings_from  # noqa: F401 - also read from here


def register(sub, name: str) -> None:
    from caidllm.options import add_model_arguments

    p = sub.add_parser(name, help="serve a model with an OpenAI-compatible HTTP API",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the folder name)")
    p.add_argument("--method", default="cai", help=f"default method: {', '.join(method_names())}")
    p.add_argument("--gen-length", type=int, default=256, help="default canvas when a request gives no max_tokens")
    p.add_argument("--block-length", type=int, default=64)
    p.add_argument("--max-gen-length", type=int, default=None, help="largest canvas a request may ask for "
                   "(default: the model's context)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt (default: what fits)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together (rows per forward)")
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond those; past it: HTTP 429")
    p.add_argument("--max-request-time", type=float, default=600.0, help="seconds before a request is cut (504)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or set CAIDLLM_API_KEY)")
    p.add_argument("--settings", default=None, metavar="FILE",
                   help="CAI settings file (caidllm calibrate): the defaults of requests for its method")
    p.add_argument("--log-level", default="info")
    replicas.add_arguments(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    import uvicorn

    from caidllm.options import load_model
    from caidllm.decode.presets import build_config
    from caidllm.serve.app import create_app

    if replicas.wanted(args):  # N replicas on Ray Serve (serve/replicas.py)
        return run_replicas(args)
    build_config(args.method, gen_length=args.gen_length, block_length=args.block_length)  # before the model loads
    settings_file_of(args)  # a bad settings file fails before the model loads too
    lm = load_model(args)
    app = create_app(lm, settings_from(args, lm), engine_thread=False)
    background = app.state.background
    # HTTP in a thread, the engine loop in the main thread (torch is faster there). SIGTERM / SIGINT:
    # uvicorn stops accepting, lets requests in flight finish (10 s at most), shuts the app down;
    # then the engine stops, cancelling whatever is left, and the exit status is 0.
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=10))
    http = threading.Thread(target=server.run, name="caidllm-http")

    def on_signal(signum, frame):
        server.should_exit = True

    def stop_engine_after_http():
        http.join()
        background.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    http.start()
    threading.Thread(target=stop_engine_after_http, daemon=True).start()
    background.run_here()
    http.join()
    if not server.started:
        raise InputError(f"the server could not start on {args.host}:{args.port} (see the log above)")
    return 0


def run_replicas(args) -> int:
    replicas.check(args)
    try:
        from caidllm.serve import ray_deployment
    except ImportError as e:
        raise InputError(f"--replicas needs Ray Serve ({e.name or e} is missing): pip install 'caidllm[ray]'") from None
    return ray_deployment.serve_until_stopped(args)
