#!/usr/bin/env python3
"""Render the hami-limits chart against a live API server (Helm's `lookup` sees real objects).

Usage: render_live.py SERVER_URL OUT_DIR [RELEASE] [NAMESPACE]

Used by tests/tests/it/chart_live.rs with the in-process API server: after `hami-certgen create`, an
upgrade render must carry the Secret's CA as the caBundle (no window without one before the
post-upgrade patch Job runs).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import helm_python as helm
except ImportError as e:  # pragma: no cover
    sys.exit(f"render_live.py: cannot import helm_python ({e}); run: pip install -r scripts/requirements-test.txt")

CHART = Path(__file__).resolve().parent.parent / "hami-limits"


def main() -> int:
    if len(sys.argv) not in (3, 5):
        print(__doc__, file=sys.stderr)
        return 2
    url, out = sys.argv[1], Path(sys.argv[2])
    release, namespace = (sys.argv[3], sys.argv[4]) if len(sys.argv) == 5 else ("hl", "hami-system")
    out.mkdir(parents=True, exist_ok=True)
    try:
        with helm.Config(kube_apiserver=url, namespace=namespace) as cfg, helm.Chart.load(CHART) as chart:
            rendered = cfg.render(chart, None, name=release, namespace=namespace, is_upgrade=True)
    except helm.HelmError as e:
        print(f"render_live.py: {e}", file=sys.stderr)
        return 1
    for template, text in rendered.items():
        if text.strip() and not template.endswith("NOTES.txt"):
            (out / Path(template).name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
