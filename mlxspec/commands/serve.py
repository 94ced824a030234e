"""`mlxspec serve`: the command that loads a pair and runs the local server
(server/http.py) until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
import time

import click

from ..errors import MlxspecError
from ..server.engine import Engine
from ..server.scheduler import default_parallel
from ..server.guard import Gate, Spare, is_loopback, parse_list, resolve_api_key
from ..server.http import DEFAULT_MAX_BODY, REQUEST_TIMEOUT, Handler, Server, Server6
from ..server.page import chat_page
from ..util.untrusted import printable
from .distributed_option import join, pipeline_option
from .options import draft_options, kv_bits_options, max_kv_size_option, max_tokens_option, model_options, sampling_kwargs, sampling_options


@click.command()
@click.argument("pair_arg", metavar="[PAIR]", required=False)
@model_options
@draft_options
@max_kv_size_option
@kv_bits_options
@pipeline_option
@sampling_options
@max_tokens_option(512, help="Reply length for requests that do not set max_tokens.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0: any free port.")
@click.option("--api-key", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1.  Visible in the process list: prefer "
                   "$MLXSPEC_API_KEY or --api-key-file, which are not.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None,
              help="Read the API key from the first line of this file (kept out of the process list).")
@click.option("--allowed-hosts", metavar="NAMES", default=None,
              help="Comma-separated host names this server may be reached as, besides localhost, 127.0.0.1, "
                   "::1 and --host ('*': any; the check stops DNS-rebinding web pages).")
@click.option("--allowed-origins", metavar="ORIGINS", default=None,
              help="Comma-separated web origins (http://host:port) whose pages may call this server, besides its "
                   "own page and loopback pages ('*': any).")
@click.option("--request-timeout", type=click.IntRange(1, 3600), default=REQUEST_TIMEOUT, show_default=True,
              help="Seconds a client may take to send a whole request, and the model's chat template and "
                   "tokenizer to turn it into tokens.")
@click.option("--insecure", is_flag=True, help="Allow a non-loopback --host without --api-key.")
@click.option("--max-queue", type=click.IntRange(1, 4096), default=8, show_default=True,
              help="Requests that may wait for the device; beyond it: HTTP 429.")
@click.option("--parallel", type=click.IntRange(1, 64), default=None,
              help="Requests that decode at the same time, each with its own KV caches and draft/verify rounds "
                   "(default: as many full-context KV caches as fit next to the models, at most 4; 1: one at a "
                   "time).")
@click.option("--max-request-bytes", type=click.IntRange(min=1024), default=DEFAULT_MAX_BODY, show_default=True,
              help="Largest request body; beyond it: HTTP 413.")
@click.option("--verbose", is_flag=True, help="Log every request to stderr.")
def serve(pair_arg, model, draft, no_draft, num_draft, num_draft_max, drafter,
          draft_p_min, draft_vocab, tree, max_kv_size, max_tokens, host, port, api_key, api_key_file,
          allowed_hosts, allowed_origins, request_timeout, insecure, max_queue, parallel, max_request_bytes, verbose,
          kv_bits=None, kv_group_size=64, pipeline=False, **opts):
    """An OpenAI-compatible local server with speculative decoding."""
    from ..api import make_decoder
    from ..models.loading import load, model_name
    from ..core.sampling import SamplingParams

    if pair_arg and model:
        raise click.UsageError("give a PAIR or --model, not both")
    api_key = resolve_api_key(api_key, api_key_file)
    if not is_loopback(host) and not api_key and not insecure:
        raise MlxspecError(f"refusing to listen on {printable(host, 100)} without --api-key: anyone who can reach "
                           "this machine could use it; pass --api-key KEY (or --insecure to allow it anyway)")
    defaults = SamplingParams(**sampling_kwargs(opts))  # each value already checked by core/options.py
    shard = join(pipeline, drafter)  # under mlx.launch: the target split over the ranks (distributed/)
    if shard is not None and shard.rank:  # ranks >= 1 listen on no port: they follow rank 0's target passes
        return shard.follow(load(pair_arg or model, draft, no_draft=True, shard=shard).target)
    try:
        cls = Server6 if ":" in host else Server
        httpd = cls((host.strip("[]"), port), Handler)
    except OSError as e:
        raise MlxspecError(f"cannot listen on {printable(host, 100)}:{port}: {e.strerror or e}")
    thread = None
    try:
        # The port answers from now on: /health says 503 "loading" (then "calibrating") and /v1 routes 503 with
        # Retry-After until the engine is set, so a client polling /health learns when it may send requests.
        spec = pair_arg or model
        httpd.model_id = str(spec) if spec else None
        httpd.model_ids = {httpd.model_id}
        httpd.api_key, httpd.max_body, httpd.verbose = api_key, max_request_bytes, verbose
        httpd.gate = Gate(host, httpd.server_address[1], parse_list(allowed_hosts), parse_list(allowed_origins))
        httpd.request_timeout, httpd.spare = request_timeout, Spare()
        httpd.page = chat_page()
        httpd.loading = {"phase": "loading", "since": time.time()}
        thread = threading.Thread(target=httpd.serve_forever, name="mlxspec-http", daemon=True)
        thread.start()
        signal.signal(signal.SIGTERM, _interrupt)
        bound_host, bound_port = httpd.server_address[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        click.echo(f"mlxspec serve: loading; http://{shown}:{bound_port}/health answers 503 until the models are "
                   "ready", err=True)
        needs_draft = drafter in (None, "model", "hybrid") or draft is not None
        pair = load(spec, draft, no_draft=no_draft or not needs_draft, shard=shard)
        httpd.loading = {**httpd.loading, "phase": "calibrating"}
        def new_decoder(cost=None):
            return make_decoder(pair, "none" if no_draft else drafter, num_draft, draft_p_min,
                                draft_vocab=draft_vocab, num_draft_max=num_draft_max, tree=tree, cost=cost,
                                max_kv_size=max_kv_size, kv_bits=kv_bits, kv_group_size=kv_group_size)

        decoder = new_decoder()
        rule = ""
        if parallel is None:
            parallel, rule = default_parallel(pair, max_kv_size)
        name = model_name(pair.target_path, pair.target_config)
        httpd.pair, httpd.defaults, httpd.max_tokens = pair, defaults, max_tokens
        httpd.model_id = str(spec) if spec else name
        httpd.model_ids = {httpd.model_id, name}
        cost = getattr(decoder.policy, "cost", None)  # the other slots' decoders do not calibrate again
        httpd.engine = Engine(pair, decoder, num_draft, max_queue, parallel,  # last: the server is ready
                              lambda: new_decoder(cost))
        click.echo(f"[{pair.describe()}]", err=True)
        click.echo(f"mlxspec serve: up to {parallel} stream{'s' if parallel > 1 else ''} at a time (--parallel"
                   f"{'; ' + rule if rule else ''})", err=True)
        click.echo(f"mlxspec serve: listening on http://{shown}:{bound_port}/ (chat page at /, OpenAI API at /v1)",
                   nl=True)
        sys.stdout.flush()
        httpd.engine.run_forever()
    finally:
        if thread is not None:
            httpd.shutdown()
        httpd.server_close()


def _interrupt(signum, frame):
    raise KeyboardInterrupt
