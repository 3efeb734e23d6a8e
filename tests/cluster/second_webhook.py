#!/usr/bin/env python3
"""A second mutating webhook for the reinvocation test (tests/tests/real_cluster/main.rs).

Usage: second_webhook.py HOST PORT CERT KEY

Serves POST / over HTTPS: a pod labelled `second-webhook: add-gpu-sidecar` gets one more container
that limits nvidia.com/gpu, so hami-limits' webhook (reinvocationPolicy: IfNeeded) must be called
again for it. Every other pod is allowed unchanged. Standard library only.
"""

import base64
import http.server
import json
import ssl
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        review = json.loads(body)
        request = review["request"]
        pod = request.get("object") or {}
        labels = (pod.get("metadata") or {}).get("labels") or {}
        response = {"uid": request["uid"], "allowed": True}
        names = [c["name"] for c in pod.get("spec", {}).get("containers", [])]
        if labels.get("second-webhook") == "add-gpu-sidecar" and "gpu-sidecar" not in names:
            patch = [{
                "op": "add",
                "path": "/spec/containers/-",
                "value": {
                    "name": "gpu-sidecar",
                    "image": "localhost/hami-limits/workload:test",
                    "command": ["sleep", "infinity"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                },
            }]
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        out = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, fmt, *args):
        sys.stderr.write("second_webhook: " + (fmt % args) + "\n")


def main():
    host, port, cert, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    server = http.server.ThreadingHTTPServer((host, port), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print("serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
