#!/usr/bin/env python3
"""Writes oversized AdmissionReviews (pods far past what a real API server stores) into the folder given as argument:

  kai-91358.json   a KAI gpu-fraction pod with 91,358 tiny containers (~3.0 MiB)
  kai-239973.json  the same with 239,973 containers (~7.9 MiB)
  hami-7.9MiB.json a HAMi GPU pod of ~7.9 MiB (containers that limit nvidia.com/gpu)
  kai-small.json   a KAI gpu-fraction pod with 3 containers (the baseline)
  kai-1000.json    a KAI gpu-fraction pod with 1,000 containers (admitted: a real 0.5 MiB patch)
"""
import json
import sys
from pathlib import Path


def review(pod: dict) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "bench", "operation": "CREATE", "object": pod}}


def kai(n: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "wide", "namespace": "bench", "annotations": {"gpu-fraction": "0.5"}},
            "spec": {"schedulerName": "kai-scheduler",
                     "containers": [{"name": f"c{i}", "image": "busybox"} for i in range(n)]}}


def hami(target_bytes: int) -> dict:
    one = {"name": "c100000", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    n = target_bytes // (len(json.dumps(one, separators=(",", ":"))) + 1)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hami-wide", "namespace": "bench"},
            "spec": {"containers": [{**one, "name": f"c{i}"} for i in range(n)]}}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, pod in [("kai-small", kai(3)), ("kai-1000", kai(1000)), ("kai-91358", kai(91_358)), ("kai-239973", kai(239_973)),
                      ("hami-7.9MiB", hami(int(7.9 * 2**20)))]:
        text = json.dumps(review(pod), separators=(",", ":"))
        (out / f"{name}.json").write_text(text)
        print(f"{name}.json: {len(text) / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
