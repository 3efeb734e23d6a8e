# syntax=docker/dockerfile:1.7
# Images for the three hami-limits programs, from one build stage (and, for the device plugin's
# libhami_preload.so, the stages zig-tools and preload):
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
# The device plugin image also carries /usr/local/lib/hami-limits/libhami_preload.so (crate
# `preload/`): the chart's `install-hook` init container (`hami-device-plugin install-hook`) copies it
# with HAMi-core into <hookPath>/vgpu on the host, first in ld.so.preload, so that it loads
# /overrideEnv into the environment before main() of every process of a workload. Workload images
# bring their own glibc, so the library is linked against glibc 2.17 (CentOS 7 and every newer
# distribution) with cargo-zigbuild, the same build as scripts/build-preload (stages zig-tools and
# preload). It is never loaded in this image.
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
        -p hami-limits --bin hami-limits \
 && mkdir -p /out \
 && cp target/release/hami-webhook target/release/hami-device-plugin \
       target/release/hami-certgen target/release/hami-limits /out/

# The preload library, as scripts/build-preload builds it: linked by zig against glibc 2.17 symbol
# stubs (cargo-zigbuild), then checked by scripts/check-preload-abi (no symbol version newer than
# GLIBC_2.17, no library beyond glibc's and libgcc_s). Its own stages, so that only the device
# plugin image needs them. The tools (PyPI wheels, pinned in scripts/requirements-build.txt) come
# first, in a layer that survives source changes; cargo-zigbuild finds zig via `python3 -m ziglang`.
FROM rust:${RUST_VERSION}-${DEBIAN} AS zig-tools
COPY scripts/requirements-build.txt /tmp/requirements-build.txt
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-pip \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m pip install --no-cache-dir --break-system-packages -r /tmp/requirements-build.txt

FROM zig-tools AS preload
WORKDIR /src
COPY . .
# x86_64 only (scripts/check-preload-abi checks for it): build on, or with --platform, linux/amd64.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    [ "$(uname -m)" = x86_64 ] \
      || { echo "libhami_preload.so is built for x86_64 only; build with --platform linux/amd64" >&2; exit 1; } \
 && cargo zigbuild --release --locked -p hami-preload --lib --target x86_64-unknown-linux-gnu.2.17 \
 && scripts/check-preload-abi target/x86_64-unknown-linux-gnu/release/libhami_preload.so \
 && install -D -m 0644 target/x86_64-unknown-linux-gnu/release/libhami_preload.so \
        /out/lib/libhami_preload.so

FROM gcr.io/distroless/cc-debian12:nonroot AS webhook
COPY --from=build /out/hami-webhook /out/hami-limits /usr/local/bin/
USER 65532:65532
EXPOSE 9443 9090
ENTRYPOINT ["/usr/local/bin/hami-webhook"]
CMD ["serve", "--config=/etc/hami-limits/webhook.yaml"]

FROM gcr.io/distroless/cc-debian12 AS device-plugin
COPY --from=build /out/hami-device-plugin /out/hami-limits /usr/local/bin/
# The chart passes this path to `hami-device-plugin install-hook --preload`.
COPY --from=preload /out/lib/libhami_preload.so /usr/local/lib/hami-limits/libhami_preload.so
USER 0:0
ENTRYPOINT ["/usr/local/bin/hami-device-plugin"]
CMD ["run"]

FROM gcr.io/distroless/cc-debian12:nonroot AS certgen
COPY --from=build /out/hami-certgen /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/hami-certgen"]
