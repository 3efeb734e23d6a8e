#!/usr/bin/env python3
"""Install, upgrade, roll back and uninstall the hami-limits chart in a real cluster, with real Helm.

Usage: helm_live.py KUBECONFIG ACTION RELEASE NAMESPACE [ARG]

  install  VALUES_JSON   helm install (creates the namespace)
  upgrade  VALUES_JSON   helm upgrade
  rollback REVISION      helm rollback RELEASE REVISION
  uninstall              helm uninstall
  history                the release's revisions, as JSON

Prints the release as Helm stores it (hooks included; `get all`), or the history, as JSON on stdout. Used by tests/tests/real_cluster/main.rs.

Hooks are off (Helm's --no-hooks) unless HAMI_HELM_HOOKS=1: the chart's certgen Jobs need a node to
run on, and the control plane of tests/tests/real_cluster/main.rs has none; that test runs
`hami-certgen create` and `patch` itself, on the host, with the hook ServiceAccount's token, where
the pre- and post- hooks would run. With a node (`scripts/cluster up --with-chart`,
tests/tests/real_node/main.rs) HAMI_HELM_HOOKS=1 runs them as Helm does: each hook Job on the node, Helm
waiting for it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

try:
    import helm_python as helm
    from helm_python import _native
    from helm_python.config import _opts
except ImportError as e:  # pragma: no cover
    sys.exit(f"helm_live.py: cannot import helm_python ({e}); run: pip install -r scripts/requirements-test.txt")

CHART = Path(__file__).resolve().parent.parent / "hami-limits"
TIMEOUT = 120


def main() -> int:
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    kubeconfig, action, release, namespace = sys.argv[1:5]
    arg = sys.argv[5] if len(sys.argv) > 5 else None
    hooks = os.environ.get("HAMI_HELM_HOOKS") == "1"
    try:
        with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as cfg:
            if action in ("install", "upgrade"):
                values = json.loads(arg or "{}")
                with helm.Chart.load(CHART) as chart:
                    common = dict(namespace=namespace, timeout_seconds=TIMEOUT, disable_hooks=not hooks)
                    if action == "install":
                        opts = _opts(create_namespace=True, **common)
                    else:
                        opts = _opts(**common)
                    out = _native.call_string(
                        f"helm_{action}",
                        cfg._raw(),
                        cfg._context_arg(None),
                        chart._raw(),
                        None,
                        release,
                        json.dumps(values),
                        opts,
                    )
                json.loads(out)
                print(json.dumps(cfg.get_all(release)))
            elif action == "rollback":
                _native.call_status(
                    "helm_rollback",
                    cfg._raw(),
                    release,
                    _opts(version=int(arg or "0"), timeout_seconds=TIMEOUT, disable_hooks=not hooks),
                )
                print(json.dumps(cfg.get_all(release)))
            elif action == "uninstall":
                out = _native.call_string(
                    "helm_uninstall",
                    cfg._raw(),
                    release,
                    _opts(timeout_seconds=TIMEOUT, disable_hooks=not hooks),
                )
                print(out)
            elif action == "history":
                print(json.dumps(cfg.history(release)))
            else:
                print(f"helm_live.py: unknown action {action!r}", file=sys.stderr)
                return 2
    except helm.HelmError as e:
        print(f"helm_live.py: {action}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
