"""The HTML training report: the run's settings, the training curve's last values and the held-out metrics."""

from __future__ import annotations

import html
from typing import Any

__all__ = ["report_html"]


def report_html(metrics: dict[str, Any]) -> str:
    """A self-contained HTML page of ``metrics`` (as written to metrics.json)."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(l)}</td><td>{m['explained_variance']:.4f}</td><td>{m['l0']:.2f}</td>"
        f"<td>{m['dead_fraction']:.3f}</td><td>{m['dense_fraction']:.3f}</td></tr>"
        for l, m in metrics["eval"]["layers"].items())
    ce = metrics["eval"]["ce_loss"]
    settings = "".join(f"<tr><td>{e(str(k))}</td><td>{e(str(v))}</td></tr>" for k, v in metrics["settings"].items())
    rec = metrics["eval"]["loss_recovered"]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>circuitgraph training report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:1.5em}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}</style></head><body>
<h1>Training report: {e(metrics['settings']['kind'])}</h1>
<p>Dictionaries: {e(str(metrics['dictionaries']))}; circuit-tracer: {e(str(metrics.get('circuit_tracer', '')))}</p>
<h2>Next-token loss on {metrics['eval']['held_out_tokens']} held-out tokens</h2>
<table><tr><th>model</th><th>dictionaries spliced in</th><th>MLPs zero-ablated</th><th>loss recovered</th></tr>
<tr><td>{ce['model']:.4f}</td><td>{ce['spliced']:.4f}</td><td>{ce['zero_ablated']:.4f}</td>
<td>{'n/a' if rec is None else f'{rec:.4f}'}</td></tr></table>
<h2>Per layer (held out)</h2>
<table><tr><th>layer</th><th>explained variance (MLP out)</th><th>L0</th><th>dead</th><th>dense</th></tr>{rows}</table>
<h2>Training</h2><p>{metrics['steps']} steps, {metrics['train_tokens']} tokens, {metrics['seconds']:.1f} s
(last step: loss {metrics['last']['loss']:.4f}, L0 {metrics['last']['l0']:.2f},
explained variance {metrics['last']['explained_variance']:.4f})</p>
<h2>Settings</h2><table>{settings}</table></body></html>
"""
