# syntax=docker/dockerfile:1.7
# Images for the three hami-limits programs, from one build stage:
#
#   docker build --target webhook       -t REGISTRY/hami-webhook:TAG .
#   docker build --target device-plugin -t REGISTRY/hami-device-plugin:TAG .
#   docker build --target certgen       -t REGISTRY/hami-certgen:TAG .
#
# Runtime images are distroless (no shell, no package manager). They are glibc-based
# (distroless/cc) rather than static: the device plugin dlopen()s the host's libnvidia-ml.so.1
# (injected by the NVIDIA container runtime), which a static musl binary cannot load; the other two
# share the build for simplicity (a few MiB). webhook and certgen run as the distroless nonroot user
# (65532); the device plugin runs as root because kubelet's socket folder and HOOK_PATH on the host are
# root-owned (the chart drops every capability and forbids privilege escalation).
#
# Not built in this repository's CI: no container engine runs there (see README, "Install").

# The toolchain the test suite runs on (the workspace MSRV is 1.89).
ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN} AS build
WORKDIR /src
# protox compiles the kubelet protos in pure Rust: no protoc needed.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        -p hami-webhook --bin hami-webhook \
        -p hami-device-plugin --bin hami-device-plugin \
        -p hami-certgen --bin hami-certgen \
        -p hami-shared --bin hami-limits \
 && mkdir -p /out \
 && cp target/release/hami-webhook target/release/hami-device-plugin \
       target/release/hami-certgen target/release/hami-limits /out/

FROM gcr.io/distroless/cc-debian12:nonroot AS webhook
COPY --from=build /out/hami-webhook /out/hami-limits /usr/local/bin/
USER 65532:65532
EXPOSE 9443 9090
ENTRYPOINT ["/usr/local/bin/hami-webhook"]
CMD ["serve", "--config=/etc/hami-limits/webhook.yaml"]

FROM gcr.io/distroless/cc-debian12 AS device-plugin
COPY --from=build /out/hami-device-plugin /out/hami-limits /usr/local/bin/
USER 0:0
ENTRYPOINT ["/usr/local/bin/hami-device-plugin"]
CMD ["run"]

FROM gcr.io/distroless/cc-debian12:nonroot AS certgen
COPY --from=build /out/hami-certgen /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/hami-certgen"]
