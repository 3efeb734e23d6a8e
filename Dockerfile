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
# Reproducible and cache-friendly:
#   - every base image is pinned by digest (the ARGs below; a tag alone can move). The tag stays in
#     the reference for the reader; the digest is what is pulled. Refresh them together, e.g.
#     `docker buildx imagetools inspect rust:1.95-bookworm` (the "Digest:" line, the multi-platform
#     index) or `crane digest rust:1.95-bookworm`;
#   - dependencies are compiled in layers of their own (stage `skeleton`: the workspace manifests,
#     Cargo.lock, device-plugin's build script and proto, and empty stand-ins for every target; then
#     `cargo build` of those): a change to the sources rebuilds only the workspace crates;
#   - SOURCE_DATE_EPOCH (build argument, default 0) sets the modification time of every file copied
#     into the images, and paths are remapped out of the binaries (RUSTFLAGS). Pass
#     `--build-arg SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)`; BuildKit also uses it for the image
#     configuration's timestamps, and with `--output type=image,...,rewrite-timestamp=true` for the
#     layers' file times.
#
# Not built in this repository's CI: no container engine runs there (see docs/operator-guide.md, "Images");
# charts/tests/render.py checks this file statically (digests, stages, stand-ins, shell syntax).

# The toolchain the test suite runs on (the workspace MSRV is 1.89), and the distroless runtimes
# (glibc; `:nonroot` runs as 65532). Digests: the multi-platform index of each tag.
ARG RUST_IMAGE=rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:latest@sha256:e5d81ddde149641e2a9ba55be4545bc125c67de07508b03ba4c22e6eb0ded5aa
ARG RUNTIME_NONROOT_IMAGE=gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f

# The workspace without its sources: manifests, the lock file, device-plugin's build script and
# proto (it runs for the dependency build too), and an empty stand-in for every target cargo
# requires to exist (libraries, binaries, benches, the allocate benchmark example). Then every
# dependency is downloaded. These layers change only when a manifest, Cargo.lock or the proto does.
FROM ${RUST_IMAGE} AS skeleton
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY shared/Cargo.toml shared/
COPY config/Cargo.toml config/
COPY publish/Cargo.toml publish/
COPY preload-reference/Cargo.toml preload-reference/
COPY ops/Cargo.toml ops/
COPY limits/Cargo.toml limits/
COPY preload/Cargo.toml preload/build.rs preload/
COPY preload-core/Cargo.toml preload-core/
COPY webhook/Cargo.toml webhook/
COPY device-plugin/Cargo.toml device-plugin/build.rs device-plugin/
COPY device-plugin/proto device-plugin/proto
COPY tests/Cargo.toml tests/
COPY certgen/Cargo.toml certgen/
RUN set -eu; \
    for lib in shared/src/lib.rs config/src/lib.rs publish/src/lib.rs preload-reference/src/lib.rs \
               ops/src/lib.rs preload/src/lib.rs preload-core/src/lib.rs webhook/src/lib.rs \
               device-plugin/src/lib.rs tests/src/lib.rs certgen/src/lib.rs; do \
        mkdir -p "$(dirname "$lib")"; : > "$lib"; \
    done; \
    for main in limits/src/main.rs preload/src/bin/probe.rs webhook/src/main.rs \
                device-plugin/src/main.rs certgen/src/main.rs \
                webhook/benches/decide.rs webhook/benches/kai_vram_index.rs webhook/benches/affinity_cost.rs \
                bench/allocate/bench.rs tests/tests/real_cluster/main.rs tests/tests/real_node/main.rs; do \
        mkdir -p "$(dirname "$main")"; echo 'fn main() {}' > "$main"; \
    done; \
    cargo fetch --locked

# The same flags for the dependency build and the real one (a change would rebuild everything):
# build paths are remapped out of panic messages and debug info.
FROM skeleton AS build
ENV CARGO_INCREMENTAL=0 \
    RUSTFLAGS="--remap-path-prefix=/src=/build --remap-path-prefix=/usr/local/cargo=/cargo"
# Dependencies only (the workspace crates are the empty stand-ins): cached until a manifest changes.
RUN cargo build --release --locked \
        -p hami-webhook --bin hami-webhook \
        -p hami-device-plugin --bin hami-device-plugin \
        -p hami-certgen --bin hami-certgen \
        -p hami-limits --bin hami-limits
# protox compiles the kubelet protos in pure Rust: no protoc needed.
COPY . .
ARG SOURCE_DATE_EPOCH=0
# The copied sources may be older than the stand-ins' build: touch them, so that cargo rebuilds
# every workspace crate from the real sources (dependencies stay as built above).
RUN set -eu; \
    find shared config publish preload-reference ops limits preload preload-core webhook device-plugin \
         tests certgen bench -name '*.rs' -exec touch {} +; \
    cargo build --release --locked \
        -p hami-webhook --bin hami-webhook \
        -p hami-device-plugin --bin hami-device-plugin \
        -p hami-certgen --bin hami-certgen \
        -p hami-limits --bin hami-limits; \
    mkdir -p /out; \
    cp target/release/hami-webhook target/release/hami-device-plugin \
       target/release/hami-certgen target/release/hami-limits /out/; \
    touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" /out/*

# The preload library, as scripts/build-preload builds it: linked by zig against glibc 2.17 symbol
# stubs (cargo-zigbuild), then checked by scripts/check-preload-abi (no symbol version newer than
# GLIBC_2.17, no library but libc.so.6, no panic path, at most 64 KiB). Its own stages, so that only the device
# plugin image needs them. The tools (PyPI wheels, pinned in scripts/requirements-build.txt) come
# first, in a layer that survives source changes; cargo-zigbuild finds zig via `python3 -m ziglang`.
FROM ${RUST_IMAGE} AS zig-tools
COPY scripts/requirements-build.txt /tmp/requirements-build.txt
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-pip \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m pip install --no-cache-dir --break-system-packages -r /tmp/requirements-build.txt

FROM zig-tools AS preload
WORKDIR /src
ENV CARGO_INCREMENTAL=0 \
    RUSTFLAGS="--remap-path-prefix=/src=/build --remap-path-prefix=/usr/local/cargo=/cargo"
# The skeleton and its downloaded dependencies, then hami-preload's dependencies alone.
COPY --from=skeleton /usr/local/cargo/registry /usr/local/cargo/registry
COPY --from=skeleton /src /src
# x86_64 only (scripts/check-preload-abi checks for it): build on, or with --platform, linux/amd64.
RUN test "$(uname -m)" = x86_64 \
      || { echo "libhami_preload.so is built for x86_64 only; build with --platform linux/amd64" >&2; exit 1; } \
 && cargo zigbuild --profile preload --locked -p hami-preload --lib --target x86_64-unknown-linux-gnu.2.17
COPY . .
ARG SOURCE_DATE_EPOCH=0
RUN set -eu; \
    find shared preload preload-core -name '*.rs' -exec touch {} +; \
    cargo zigbuild --profile preload --locked -p hami-preload --lib --target x86_64-unknown-linux-gnu.2.17; \
    scripts/check-preload-abi target/x86_64-unknown-linux-gnu/preload/libhami_preload.so; \
    install -D -m 0644 target/x86_64-unknown-linux-gnu/preload/libhami_preload.so \
        /out/lib/libhami_preload.so; \
    touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" /out/lib/libhami_preload.so

FROM ${RUNTIME_NONROOT_IMAGE} AS webhook
COPY --from=build /out/hami-webhook /out/hami-limits /usr/local/bin/
USER 65532:65532
EXPOSE 9443 9090
ENTRYPOINT ["/usr/local/bin/hami-webhook"]
CMD ["serve", "--config=/etc/hami-limits/webhook.yaml"]

FROM ${RUNTIME_IMAGE} AS device-plugin
COPY --from=build /out/hami-device-plugin /out/hami-limits /usr/local/bin/
# The chart passes this path to `hami-device-plugin install-hook --preload`.
COPY --from=preload /out/lib/libhami_preload.so /usr/local/lib/hami-limits/libhami_preload.so
USER 0:0
ENTRYPOINT ["/usr/local/bin/hami-device-plugin"]
CMD ["run"]

FROM ${RUNTIME_NONROOT_IMAGE} AS certgen
COPY --from=build /out/hami-certgen /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/hami-certgen"]
