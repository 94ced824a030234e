"""`mlxspec calibrate`: measure (again) a pair's draft and verify costs (costs/cost_model.py) and cache them
-- unless other programs kept the machine busy meanwhile (costs/machine_load.py): then exit 1, the
earlier calibration kept."""

from __future__ import annotations

import json

from ..costs.calibration import cache_key, calibration_dir, for_decoder
from ..costs.machine_load import describe, too_busy


def _check_cached(cm, key=None) -> None:
    """Exit 1 when other programs kept the machine busy while the figures were measured
    (costs/machine_load.py), so they are off: an earlier calibration stays; without one they
    are cached marked as such, and measured again by the first run on an idle machine."""
    import click

    if too_busy(cm.busy):
        kept = None
        if key is not None:
            from ..costs.calibration import load_cached

            cached = load_cached(key)
            kept = cached is not None and cached.busy == cm.busy
        what = ("cached, marked as measured under load (measured again on an idle machine)" if kept
                else "not cached")
        raise click.ClickException(f"{what}: {describe(cm.busy)} while measuring; run it again when the "
                                   "machine is idle")


def _command():
    import click

    from .generate import model_options, parse_draft_vocab

    @click.command()
    @model_options
    @click.option("--drafter", default=None, help="model | hybrid | lookup | layerskip (default: model).")
    @click.option("--draft-vocab", default=None, callback=lambda c, p, v: parse_draft_vocab(v),
                  help="The draft head's vocabulary subset, as for generate.")
    @click.option("--json", "as_json", is_flag=True, help="Print the cost model as JSON.")
    def calibrate_cmd(model, draft, no_draft, drafter, draft_vocab, as_json):
        """Measure (again) what a draft step and a verify pass cost on this machine, and cache it."""
        from ..api import make_drafter
        from ..models.loading import load

        needs_draft = drafter in (None, "model", "hybrid")
        pair = load(model, draft, no_draft=no_draft or not needs_draft)
        d = make_drafter(pair, drafter, 0.0, draft_vocab)
        if not d.max_k:
            raise click.UsageError("nothing to calibrate without a drafter: load a draft model or pick --drafter lookup")
        cm = for_decoder(pair, d, refresh=True, say=None)
        if as_json:
            click.echo(json.dumps({"pair": pair.describe(), "drafter": d.name, **cm.to_dict()}))
            _check_cached(cm, cache_key(pair, d))
            return
        click.echo(f"{pair.describe()}, drafter {d.name}")
        click.echo(f"plain target step: {1000 * cm.plain_step_s:.1f} ms")
        click.echo(f"draft step: {cm.draft_step:.2f} plain steps")
        click.echo("verify pass by width: " + ", ".join(cm.describe_width(w) for w in (1, 2, 3, 5, 9, 13, 17)))
        if cm.monotone:
            click.echo("(as measured a wider pass came out cheaper somewhere: noise, since on the small-batch "
                       "kernel it does more work; the curve is used non-decreasing, the file keeps the figures)")
        if cm.draft_widths:
            click.echo("draft forward by width (its own steps): "
                       + ", ".join(f"{w}: {cm.draft_curve(w):.2f}" for w in (1, 2, 3, 4, 8, 16)))
        key = cache_key(pair, d)
        _check_cached(cm, key)
        click.echo(f"cached in {calibration_dir() / (key + '.json')}" if key else "(not cached: models without a folder)")

    return calibrate_cmd


calibrate_command = _command()
